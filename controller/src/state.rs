//! `ClusterState`: the replicated cluster metadata (brokers, topics, partitions,
//! leaders, epochs, ISR) and its one mutator, the pure and deterministic `apply`.
//! It must never read a clock, touch a file or use randomness: every replica of the
//! controller applies the same commands and must end in the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command::{Command, CommandError, Outcome, Reply};
use crate::delta::{Delta, DeltaLog, NeedSnapshot, VersionedDelta};
use crate::ids::{
    BrokerEpoch, BrokerId, LeaderEpoch, MetadataVersion, PartitionEpoch, PartitionIndex, TopicId,
};
use crate::placement::{self, PlacementBroker};
use crate::records::{BrokerEndpoints, BrokerRecord, PartitionRecord, TopicRecord};
use crate::validate;

pub use crate::limits::StateLimits;

pub use protocol::control::records::MetadataImage;

/// Producer ids in one block: a broker asks the quorum once per this many
/// producers it starts.
pub const PRODUCER_ID_BLOCK_COUNT: u32 = 1_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    limits: StateLimits,
    metadata_version: MetadataVersion,
    brokers: BTreeMap<BrokerId, BrokerRecord>,
    topics: BTreeMap<TopicId, TopicRecord>,
    topic_ids_by_name: BTreeMap<String, TopicId>,
    next_topic_id: TopicId,
    total_partition_count: usize,
    deltas: DeltaLog,
    /// The first producer id no broker was given yet.
    #[serde(default)]
    next_producer_id: i64,
}

impl Default for ClusterState {
    fn default() -> ClusterState {
        ClusterState::new(StateLimits::default())
    }
}

impl ClusterState {
    pub fn new(limits: StateLimits) -> ClusterState {
        let deltas = DeltaLog::new(limits.deltas_retained_max);
        ClusterState {
            limits,
            metadata_version: MetadataVersion(0),
            brokers: BTreeMap::new(),
            topics: BTreeMap::new(),
            topic_ids_by_name: BTreeMap::new(),
            next_topic_id: TopicId(1),
            total_partition_count: 0,
            deltas,
            next_producer_id: 0,
        }
    }

    /// Applies one command. A refused command changes nothing; a command that changed
    /// what brokers see bumps the metadata version by exactly one and records deltas.
    /// Heartbeats only move a session deadline and do not bump the version.
    pub fn apply(&mut self, command: &Command) -> Reply {
        let version = self.metadata_version.next();
        let mut deltas = Vec::new();
        let result = match command {
            Command::RegisterBroker {
                broker_id,
                endpoints,
                now_ms,
                session_timeout_ms,
                incarnation_id,
            } => self.register_broker(
                Registration {
                    broker_id: *broker_id,
                    endpoints,
                    now_ms: *now_ms,
                    session_timeout_ms: *session_timeout_ms,
                    incarnation_id: *incarnation_id,
                },
                version,
                &mut deltas,
            ),
            Command::BrokerHeartbeat {
                broker_id,
                broker_epoch,
                now_ms,
            } => self.heartbeat(*broker_id, *broker_epoch, *now_ms),
            Command::UnfenceBroker {
                broker_id,
                broker_epoch,
            } => self.unfence_broker(*broker_id, *broker_epoch, &mut deltas),
            Command::FenceExpiredBrokers { now_ms } => Ok(self.fence_expired(*now_ms, &mut deltas)),
            Command::FenceBroker {
                broker_id,
                broker_epoch,
            } => self.fence_on_request(*broker_id, *broker_epoch, &mut deltas),
            Command::CreateTopic {
                name,
                partition_count,
                replication_factor,
                config,
            } => self.create_topic(
                name,
                *partition_count,
                *replication_factor,
                config,
                &mut deltas,
            ),
            Command::DeleteTopic { name } => self.delete_topic(name, &mut deltas),
            Command::AlterTopicConfig { name, set, remove } => {
                self.alter_topic_config(name, set, remove, &mut deltas)
            }
            Command::AllocateProducerIds {
                broker_id,
                broker_epoch,
            } => self.allocate_producer_ids(*broker_id, *broker_epoch),
            Command::AlterIsr {
                topic_id,
                partition,
                leader_id,
                leader_epoch,
                partition_epoch,
                new_isr,
                new_isr_epochs,
            } => {
                let expected = IsrExpectation {
                    leader_id: *leader_id,
                    leader_epoch: *leader_epoch,
                    partition_epoch: *partition_epoch,
                };
                self.alter_isr(
                    *topic_id,
                    *partition,
                    expected,
                    (new_isr, new_isr_epochs),
                    &mut deltas,
                )
            }
        };
        if !deltas.is_empty() {
            assert!(result.is_ok(), "a refused command must not change state");
            self.metadata_version = version;
            for delta in deltas {
                self.deltas.push(version, delta);
            }
        }
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
        Reply {
            metadata_version: self.metadata_version,
            result,
        }
    }

    /// Every change after version `since`, or `NeedSnapshot` when they are no
    /// longer retained (then load `image()`).
    pub fn deltas_since(
        &self,
        since: MetadataVersion,
    ) -> Result<Vec<VersionedDelta>, NeedSnapshot> {
        self.deltas.since(since, self.metadata_version)
    }

    pub fn image(&self) -> MetadataImage {
        MetadataImage {
            metadata_version: self.metadata_version,
            brokers: self.brokers.values().cloned().collect(),
            topics: self.topics.values().cloned().collect(),
        }
    }

    pub fn metadata_version(&self) -> MetadataVersion {
        self.metadata_version
    }

    pub fn limits(&self) -> &StateLimits {
        &self.limits
    }

    pub fn broker(&self, id: BrokerId) -> Option<&BrokerRecord> {
        self.brokers.get(&id)
    }

    pub fn brokers(&self) -> impl Iterator<Item = &BrokerRecord> {
        self.brokers.values()
    }

    pub fn topic(&self, id: TopicId) -> Option<&TopicRecord> {
        self.topics.get(&id)
    }

    pub fn topic_by_name(&self, name: &str) -> Option<&TopicRecord> {
        self.topic_ids_by_name
            .get(name)
            .and_then(|id| self.topics.get(id))
    }

    pub fn topics(&self) -> impl Iterator<Item = &TopicRecord> {
        self.topics.values()
    }

    pub fn partition(
        &self,
        topic_id: TopicId,
        partition: PartitionIndex,
    ) -> Option<&PartitionRecord> {
        self.topics
            .get(&topic_id)?
            .partitions
            .get(partition.0 as usize)
    }

    /// Unfenced brokers whose session deadline is at or before `now_ms`: the
    /// controller leader proposes `FenceExpiredBrokers` only when this is non-empty.
    pub fn expired_brokers(&self, now_ms: u64) -> Vec<BrokerId> {
        self.brokers
            .values()
            .filter(|b| !b.fenced && b.session_deadline_ms <= now_ms)
            .map(|b| b.id)
            .collect()
    }

    fn register_broker(
        &mut self,
        registration: Registration<'_>,
        version: MetadataVersion,
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        let Registration {
            broker_id,
            endpoints,
            now_ms,
            session_timeout_ms,
            incarnation_id,
        } = registration;
        validate::endpoints(endpoints, &self.limits)?;
        let (min, max) = (
            self.limits.session_timeout_ms_min,
            self.limits.session_timeout_ms_max,
        );
        if !(min..=max).contains(&session_timeout_ms) {
            return Err(CommandError::SessionTimeoutOutOfRange {
                got: session_timeout_ms,
                min,
                max,
            });
        }
        if let Some(previous) = self.brokers.get_mut(&broker_id) {
            // The same process asking again (its answer was lost, or it
            // follows a new controller leader): keep its epoch, fence nothing,
            // give it a fresh session.
            if incarnation_id != 0
                && previous.incarnation_id == incarnation_id
                && previous.endpoints == *endpoints
            {
                previous.session_timeout_ms = session_timeout_ms;
                previous.session_deadline_ms = previous
                    .session_deadline_ms
                    .max(now_ms.saturating_add(session_timeout_ms));
                return Ok(Outcome::BrokerRegistered {
                    broker_epoch: previous.epoch,
                });
            }
        }
        match self.brokers.get(&broker_id) {
            Some(previous) if previous.shard_count() != endpoints.shards.len() => {
                return Err(CommandError::ShardCountChanged {
                    broker_id,
                    previous: previous.shard_count(),
                    got: endpoints.shards.len(),
                });
            }
            Some(previous) if !previous.fenced => self.fence_broker(broker_id, deltas),
            Some(_) => {}
            None if self.brokers.len() >= self.limits.broker_count_max => {
                return Err(CommandError::BrokerCountMax(self.limits.broker_count_max));
            }
            None => {}
        }
        // The epoch is the version that registered it: unique and increasing.
        let record = BrokerRecord {
            id: broker_id,
            epoch: BrokerEpoch(version.0),
            endpoints: endpoints.clone(),
            fenced: true,
            session_timeout_ms,
            session_deadline_ms: now_ms.saturating_add(session_timeout_ms),
            incarnation_id,
        };
        deltas.push(Delta::BrokerRegistered(record.clone()));
        self.brokers.insert(broker_id, record);
        Ok(Outcome::BrokerRegistered {
            broker_epoch: BrokerEpoch(version.0),
        })
    }

    fn current_broker(
        &mut self,
        broker_id: BrokerId,
        epoch: BrokerEpoch,
    ) -> Result<&mut BrokerRecord, CommandError> {
        let broker = self
            .brokers
            .get_mut(&broker_id)
            .ok_or(CommandError::UnknownBroker(broker_id))?;
        if broker.epoch != epoch {
            return Err(CommandError::StaleBrokerEpoch {
                broker_id,
                current: broker.epoch,
                got: epoch,
            });
        }
        Ok(broker)
    }

    /// Gives a registered broker the next block of producer ids. Changes
    /// nothing brokers see, so the metadata version stays.
    fn allocate_producer_ids(
        &mut self,
        broker_id: BrokerId,
        epoch: BrokerEpoch,
    ) -> Result<Outcome, CommandError> {
        self.current_broker(broker_id, epoch)?;
        let first = self.next_producer_id;
        let next = first
            .checked_add(i64::from(PRODUCER_ID_BLOCK_COUNT))
            .ok_or(CommandError::ProducerIdsExhausted)?;
        self.next_producer_id = next;
        Ok(Outcome::ProducerIdsAllocated {
            first,
            count: PRODUCER_ID_BLOCK_COUNT,
        })
    }

    /// The first producer id not given to any broker yet.
    pub fn next_producer_id(&self) -> i64 {
        self.next_producer_id
    }

    fn heartbeat(
        &mut self,
        broker_id: BrokerId,
        epoch: BrokerEpoch,
        now_ms: u64,
    ) -> Result<Outcome, CommandError> {
        let broker = self.current_broker(broker_id, epoch)?;
        // Never move a deadline backwards: a new controller leader's clock may lag.
        let deadline_ms = now_ms.saturating_add(broker.session_timeout_ms);
        broker.session_deadline_ms = broker.session_deadline_ms.max(deadline_ms);
        Ok(Outcome::HeartbeatAccepted {
            fenced: broker.fenced,
        })
    }

    fn unfence_broker(
        &mut self,
        broker_id: BrokerId,
        epoch: BrokerEpoch,
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        let broker = self.current_broker(broker_id, epoch)?;
        if !broker.fenced {
            return Ok(Outcome::BrokerUnfenced);
        }
        broker.fenced = false;
        deltas.push(Delta::BrokerUnfenced(broker_id));
        // Offline partitions this broker can now lead come back online.
        let brokers = &self.brokers;
        for topic in self.topics.values_mut() {
            let unclean = topic.unclean_leader_election_enable();
            for (index, partition) in topic.partitions.iter_mut().enumerate() {
                if partition.leader.is_some() || !partition.has_replica(broker_id) {
                    continue;
                }
                if let Some((leader, isr)) =
                    elect_leader(partition, &partition.isr, unclean, brokers)
                {
                    change_partition(partition, Some(leader), isr);
                    deltas.push(partition_delta(topic.id, index, partition));
                }
            }
        }
        Ok(Outcome::BrokerUnfenced)
    }

    fn fence_on_request(
        &mut self,
        broker_id: BrokerId,
        epoch: BrokerEpoch,
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        let fenced = self.current_broker(broker_id, epoch)?.fenced;
        if fenced {
            return Ok(Outcome::BrokersFenced { broker_ids: vec![] });
        }
        self.fence_broker(broker_id, deltas);
        Ok(Outcome::BrokersFenced {
            broker_ids: vec![broker_id],
        })
    }

    fn fence_expired(&mut self, now_ms: u64, deltas: &mut Vec<Delta>) -> Outcome {
        let expired = self.expired_brokers(now_ms);
        for &broker_id in &expired {
            self.fence_broker(broker_id, deltas);
        }
        Outcome::BrokersFenced {
            broker_ids: expired,
        }
    }

    /// Fences an unfenced broker: it leaves every ISR and every partition it led
    /// gets a new leader. One exception: the last ISR member stays in the ISR of a
    /// partition that goes offline, so that when it returns it can be elected
    /// cleanly; removing it would leave an empty ISR and no clean leader ever again.
    fn fence_broker(&mut self, broker_id: BrokerId, deltas: &mut Vec<Delta>) {
        let broker = self
            .brokers
            .get_mut(&broker_id)
            .expect("fence_broker: known broker");
        assert!(!broker.fenced, "fence_broker: already fenced");
        broker.fenced = true;
        deltas.push(Delta::BrokerFenced(broker_id));
        let brokers = &self.brokers;
        for topic in self.topics.values_mut() {
            let unclean = topic.unclean_leader_election_enable();
            for (index, partition) in topic.partitions.iter_mut().enumerate() {
                if !partition.isr.contains(&broker_id) && partition.leader != Some(broker_id) {
                    continue;
                }
                let mut isr = partition.isr.clone();
                if isr.len() > 1 {
                    isr.retain(|&b| b != broker_id);
                }
                let (leader, isr) = if partition.leader == Some(broker_id) {
                    match elect_leader(partition, &isr, unclean, brokers) {
                        Some((leader, isr)) => (Some(leader), isr),
                        None => (None, isr),
                    }
                } else {
                    (partition.leader, isr)
                };
                if change_partition(partition, leader, isr) {
                    deltas.push(partition_delta(topic.id, index, partition));
                }
            }
        }
    }

    fn create_topic(
        &mut self,
        name: &str,
        partition_count: u32,
        replication_factor: u16,
        config: &BTreeMap<String, String>,
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        self.validate_new_topic(name, partition_count, config)?;
        let live = self.placement_brokers();
        let topic_id = self.next_topic_id;
        let placed = placement::place_topic(&live, partition_count, replication_factor, topic_id.0)
            .map_err(|_| CommandError::InvalidReplicationFactor {
                replication_factor,
                live_broker_count: live.len(),
            })?;
        let partitions: Vec<PartitionRecord> = placed
            .into_iter()
            .map(|replicas| {
                let mut isr: Vec<BrokerId> = replicas.iter().map(|r| r.broker_id).collect();
                isr.sort();
                PartitionRecord {
                    leader: Some(replicas[0].broker_id),
                    replicas,
                    isr,
                    leader_epoch: LeaderEpoch(0),
                    partition_epoch: PartitionEpoch(0),
                }
            })
            .collect();
        let topic = TopicRecord {
            id: topic_id,
            name: name.to_owned(),
            replication_factor,
            config: config.clone(),
            partitions,
        };
        self.next_topic_id = TopicId(topic_id.0 + 1);
        self.total_partition_count += topic.partition_count();
        self.topic_ids_by_name.insert(topic.name.clone(), topic_id);
        deltas.push(Delta::TopicCreated(topic.clone()));
        self.topics.insert(topic_id, topic);
        Ok(Outcome::TopicCreated { topic_id })
    }

    fn validate_new_topic(
        &self,
        name: &str,
        partition_count: u32,
        config: &BTreeMap<String, String>,
    ) -> Result<(), CommandError> {
        validate::topic_name(name)?;
        if self.topic_ids_by_name.contains_key(name) {
            return Err(CommandError::TopicExists(name.to_owned()));
        }
        if self.topics.len() >= self.limits.topic_count_max {
            return Err(CommandError::TopicCountMax(self.limits.topic_count_max));
        }
        let max = self.limits.partition_count_max;
        if partition_count == 0 || partition_count > max {
            return Err(CommandError::InvalidPartitionCount {
                got: partition_count,
                max,
            });
        }
        if self.total_partition_count + partition_count as usize
            > self.limits.total_partition_count_max
        {
            return Err(CommandError::PartitionCountMax(
                self.limits.total_partition_count_max,
            ));
        }
        validate::topic_config(config, &self.limits)
    }

    /// Unfenced brokers with the replicas each of their shards already holds.
    fn placement_brokers(&self) -> Vec<PlacementBroker> {
        let mut live: BTreeMap<BrokerId, PlacementBroker> = self
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| {
                (
                    b.id,
                    PlacementBroker {
                        id: b.id,
                        shard_replica_counts: vec![0; b.shard_count()],
                    },
                )
            })
            .collect();
        for replica in self
            .topics
            .values()
            .flat_map(|t| &t.partitions)
            .flat_map(|p| &p.replicas)
        {
            if let Some(b) = live.get_mut(&replica.broker_id) {
                b.shard_replica_counts[usize::from(replica.shard.0)] += 1;
            }
        }
        live.into_values().collect()
    }

    fn delete_topic(
        &mut self,
        name: &str,
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        let topic_id = self
            .topic_ids_by_name
            .remove(name)
            .ok_or_else(|| CommandError::UnknownTopic(name.to_owned()))?;
        let topic = self
            .topics
            .remove(&topic_id)
            .expect("name index matches topics");
        self.total_partition_count -= topic.partition_count();
        deltas.push(Delta::TopicDeleted {
            topic_id,
            name: topic.name,
        });
        Ok(Outcome::TopicDeleted { topic_id })
    }

    fn alter_topic_config(
        &mut self,
        name: &str,
        set: &BTreeMap<String, String>,
        remove: &[String],
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        let topic_id = *self
            .topic_ids_by_name
            .get(name)
            .ok_or_else(|| CommandError::UnknownTopic(name.to_owned()))?;
        let topic = self
            .topics
            .get(&topic_id)
            .expect("name index matches topics");
        let mut config = topic.config.clone();
        for key in remove {
            config.remove(key);
        }
        config.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
        validate::topic_config(&config, &self.limits)?;
        let topic = self.topics.get_mut(&topic_id).expect("looked up above");
        if topic.config != config {
            topic.config = config.clone();
            deltas.push(Delta::TopicConfigChanged { topic_id, config });
        }
        Ok(Outcome::TopicConfigAltered { topic_id })
    }

    fn alter_isr(
        &mut self,
        topic_id: TopicId,
        index: PartitionIndex,
        expected: IsrExpectation,
        (new_isr, new_isr_epochs): (&[BrokerId], &[BrokerEpoch]),
        deltas: &mut Vec<Delta>,
    ) -> Result<Outcome, CommandError> {
        let topic = self
            .topics
            .get_mut(&topic_id)
            .ok_or(CommandError::UnknownTopicId(topic_id))?;
        let partition =
            topic
                .partitions
                .get_mut(index.0 as usize)
                .ok_or(CommandError::UnknownPartition {
                    topic_id,
                    partition: index,
                })?;
        if partition.leader_epoch != expected.leader_epoch {
            return Err(CommandError::StaleLeaderEpoch {
                current: partition.leader_epoch,
                got: expected.leader_epoch,
            });
        }
        if partition.leader != Some(expected.leader_id) {
            return Err(CommandError::NotLeader {
                current: partition.leader,
                got: expected.leader_id,
            });
        }
        if partition.partition_epoch != expected.partition_epoch {
            return Err(CommandError::StalePartitionEpoch {
                current: partition.partition_epoch,
                got: expected.partition_epoch,
            });
        }
        let isr = checked_isr(partition, expected.leader_id, new_isr, &self.brokers)?;
        // KIP-903: a member that registered again since the leader saw it
        // fetch may have lost what it had fetched; it rejoins only on progress
        // made by its current incarnation.
        for (member, epoch) in new_isr.iter().zip(new_isr_epochs) {
            // 0: the leader has not seen this member fetch yet; it may only
            // stay, not join.
            if epoch.0 == 0 && partition.isr.contains(member) {
                continue;
            }
            let current = self.brokers.get(member).map(|b| b.epoch);
            if current != Some(*epoch) {
                return Err(CommandError::IsrStaleBrokerEpoch {
                    broker_id: *member,
                    current: current.unwrap_or(BrokerEpoch(0)),
                    got: *epoch,
                });
            }
        }
        let leader = partition.leader;
        if change_partition(partition, leader, isr) {
            deltas.push(partition_delta(topic_id, index.0 as usize, partition));
        }
        Ok(Outcome::IsrAltered {
            partition: partition.clone(),
        })
    }

    /// Asserts every invariant of the state; O(partitions). `apply` calls it in
    /// debug builds, tests call it after every step.
    pub fn check_invariants(&self) {
        for (id, broker) in &self.brokers {
            assert_eq!(*id, broker.id);
            assert!(broker.shard_count() >= 1);
            assert!(
                broker.epoch.0 <= self.metadata_version.0,
                "broker epoch from the future"
            );
        }
        assert_eq!(self.topics.len(), self.topic_ids_by_name.len());
        let mut total_partition_count = 0;
        for (id, topic) in &self.topics {
            assert_eq!(*id, topic.id);
            assert!(topic.id < self.next_topic_id);
            assert_eq!(self.topic_ids_by_name.get(&topic.name), Some(id));
            assert!(topic.partition_count() >= 1);
            total_partition_count += topic.partition_count();
            for partition in &topic.partitions {
                self.check_partition(topic, partition);
            }
        }
        assert_eq!(total_partition_count, self.total_partition_count);
        assert!(total_partition_count <= self.limits.total_partition_count_max);
        self.deltas.check_invariants(self.metadata_version);
    }

    fn check_partition(&self, topic: &TopicRecord, partition: &PartitionRecord) {
        let alive = |b: &BrokerId| self.brokers.get(b).is_some_and(|r| !r.fenced);
        assert_eq!(
            partition.replicas.len(),
            usize::from(topic.replication_factor)
        );
        for (i, replica) in partition.replicas.iter().enumerate() {
            let broker = self
                .brokers
                .get(&replica.broker_id)
                .expect("replica on a registered broker");
            assert!(
                usize::from(replica.shard.0) < broker.shard_count(),
                "replica on a missing shard"
            );
            assert!(
                !partition.replicas[..i]
                    .iter()
                    .any(|r| r.broker_id == replica.broker_id),
                "replica listed twice"
            );
        }
        assert!(!partition.isr.is_empty(), "ISR is never empty");
        assert!(
            partition.isr.windows(2).all(|w| w[0] < w[1]),
            "ISR sorted and distinct"
        );
        assert!(
            partition.isr.iter().all(|b| partition.has_replica(*b)),
            "ISR within replicas"
        );
        assert!(partition.leader_epoch.0 >= 0 && partition.partition_epoch.0 >= 0);
        match partition.leader {
            Some(leader) => {
                assert!(partition.isr.contains(&leader), "leader in ISR");
                assert!(
                    partition.isr.iter().all(alive),
                    "a led partition's ISR has only unfenced brokers"
                );
            }
            None => {
                assert!(
                    !partition.isr.iter().any(alive),
                    "offline partition with an electable ISR member"
                );
                if topic.unclean_leader_election_enable() {
                    assert!(
                        !partition.replicas.iter().any(|r| alive(&r.broker_id)),
                        "offline with a live replica"
                    );
                }
            }
        }
    }

    /// Asserts that `self` can follow `before` by applying commands: versions and
    /// epochs never go back, and every change of a partition bumped its epochs.
    pub fn check_successor(&self, before: &ClusterState) {
        assert!(self.metadata_version >= before.metadata_version);
        assert!(self.next_topic_id >= before.next_topic_id);
        for (id, broker) in &self.brokers {
            if let Some(old) = before.brokers.get(id) {
                assert!(broker.epoch >= old.epoch);
            }
        }
        for (id, topic) in &self.topics {
            let Some(old_topic) = before.topics.get(id) else {
                continue;
            };
            for (new, old) in topic.partitions.iter().zip(&old_topic.partitions) {
                assert!(
                    new.leader_epoch >= old.leader_epoch
                        && new.partition_epoch >= old.partition_epoch
                );
                if new != old {
                    assert!(
                        new.partition_epoch > old.partition_epoch,
                        "partition changed without an epoch bump"
                    );
                }
                if new.leader != old.leader {
                    assert!(
                        new.leader_epoch > old.leader_epoch,
                        "leader changed without an epoch bump"
                    );
                }
            }
        }
        if self.metadata_version == before.metadata_version {
            assert_eq!(
                self.topics, before.topics,
                "topics changed without a version bump"
            );
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct IsrExpectation {
    leader_id: BrokerId,
    leader_epoch: LeaderEpoch,
    partition_epoch: PartitionEpoch,
}

/// Picks a leader: the first unfenced ISR member in replica order; else, when unclean
/// election is allowed, the first unfenced replica, with an ISR of only itself.
fn elect_leader(
    partition: &PartitionRecord,
    isr: &[BrokerId],
    unclean: bool,
    brokers: &BTreeMap<BrokerId, BrokerRecord>,
) -> Option<(BrokerId, Vec<BrokerId>)> {
    let alive = |b: BrokerId| brokers.get(&b).is_some_and(|r| !r.fenced);
    let replicas = || partition.replicas.iter().map(|r| r.broker_id);
    if let Some(leader) = replicas().find(|b| isr.contains(b) && alive(*b)) {
        let live_isr = isr.iter().copied().filter(|b| alive(*b)).collect();
        return Some((leader, live_isr));
    }
    if unclean {
        return replicas()
            .find(|b| alive(*b))
            .map(|leader| (leader, vec![leader]));
    }
    None
}

/// A `RegisterBroker` command's fields.
struct Registration<'a> {
    broker_id: BrokerId,
    endpoints: &'a BrokerEndpoints,
    now_ms: u64,
    session_timeout_ms: u64,
    incarnation_id: u64,
}

/// Validates a proposed ISR and returns it sorted.
fn checked_isr(
    partition: &PartitionRecord,
    leader_id: BrokerId,
    new_isr: &[BrokerId],
    brokers: &BTreeMap<BrokerId, BrokerRecord>,
) -> Result<Vec<BrokerId>, CommandError> {
    let mut isr = new_isr.to_vec();
    isr.sort();
    if let Some(w) = isr.windows(2).find(|w| w[0] == w[1]) {
        return Err(CommandError::IsrDuplicate(w[0]));
    }
    if let Some(b) = isr.iter().find(|b| !partition.has_replica(**b)) {
        return Err(CommandError::IsrNotReplica(*b));
    }
    if let Some(b) = isr.iter().find(|b| brokers.get(b).is_none_or(|r| r.fenced)) {
        return Err(CommandError::IsrIneligible(*b));
    }
    if !isr.contains(&leader_id) {
        return Err(CommandError::IsrMissingLeader(leader_id));
    }
    Ok(isr)
}

/// Sets leader and ISR, bumping the leader epoch if the leader changed and the
/// partition epoch if anything changed. Returns whether anything changed.
fn change_partition(
    partition: &mut PartitionRecord,
    leader: Option<BrokerId>,
    mut isr: Vec<BrokerId>,
) -> bool {
    isr.sort();
    if partition.leader == leader && partition.isr == isr {
        return false;
    }
    if partition.leader != leader {
        partition.leader = leader;
        partition.leader_epoch = partition.leader_epoch.next();
    }
    partition.isr = isr;
    partition.partition_epoch = partition.partition_epoch.next();
    true
}

fn partition_delta(topic_id: TopicId, index: usize, partition: &PartitionRecord) -> Delta {
    let partition_index = PartitionIndex(u32::try_from(index).expect("partition count fits u32"));
    Delta::PartitionChanged {
        topic_id,
        partition: partition_index,
        record: partition.clone(),
    }
}
