//! `Admin`: topic management and cluster inspection (create, delete, list,
//! describe, metadata), consumer group administration (list, describe with
//! lag, reset, delete) and transaction inspection (list, describe). Topic
//! requests go to any reachable broker; group and transaction requests to
//! the coordinator, except ListGroups and ListTransactions, which go to
//! every broker because each lists only what it coordinates.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use protocol::{ApiKey, MemberEpoch};

use crate::accumulator::TopicPartition;
use crate::cluster::Cluster;
use crate::config::{ClientConfig, ConsumerConfig, IsolationLevel};
use crate::consumer::list_offsets;
use crate::consumer_record::decode_records;
use crate::coordinator::{Coordinator, RetryPolicy};
use crate::error::{ClientError, Result};
use crate::group_types::{
    clamp_offset, CommittedOffset, CoordinatorInfo, GroupDescription, GroupListing,
    GroupPartitionDescription, PartitionReset, ResetTo,
};
use crate::messages::{
    self, FetchEntry, TransactionDescription, TIMESTAMP_EARLIEST, TIMESTAMP_LATEST,
};
use crate::metadata::ClusterMetadata;
pub use crate::topic_types::{PartitionDescription, TopicDescription, TopicSummary};

/// Attempts at one broker's ListGroups (it may be loading its groups).
const LIST_GROUPS_ATTEMPTS_MAX: u32 = 3;
/// Pause between retries of ListOffsets and ListGroups.
const ADMIN_RETRY_BACKOFF_MS: u64 = 100;
/// Bound on partitions whose lag in time `describe_group` reads (one fetch
/// each); past it `lag_ms` is `None`.
const LAG_TIME_PARTITIONS_MAX: usize = 1_000;
/// Bound on the bytes of the one-partition fetch that reads a record's
/// timestamp for the lag in time.
const LAG_FETCH_BYTES_MAX: i32 = 1 << 20;

/// Administrative client; cheap to clone.
#[derive(Clone, Debug)]
pub struct Admin {
    cluster: Cluster,
}

impl Admin {
    pub async fn connect(bootstrap: &str, config: ClientConfig) -> Result<Admin> {
        Ok(Admin::from_cluster(
            Cluster::connect(bootstrap, config).await?,
        ))
    }

    pub fn from_cluster(cluster: Cluster) -> Admin {
        Admin { cluster }
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Creates a topic. `configs` are key/value strings the broker validates
    /// (retention.ms, retention.bytes, segment.bytes, segment.ms, flush.policy).
    pub async fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &[(String, String)],
    ) -> Result<()> {
        let body = messages::create_topics_request(name, partitions, replication_factor, configs);
        let response = self
            .cluster
            .request_any(ApiKey::CreateTopics, &body)
            .await?;
        messages::create_topics_response(response.body(), name)
    }

    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        let body = messages::delete_topics_request(name);
        let response = self
            .cluster
            .request_any(ApiKey::DeleteTopics, &body)
            .await?;
        messages::delete_topics_response(response.body(), name)
    }

    /// Sets (`set`) and removes (`remove`) keys of a topic's config; removed
    /// keys take the broker default again. The broker checks the resulting
    /// config and answers once its own metadata shows it.
    pub async fn alter_topic_config(
        &self,
        name: &str,
        set: &[(String, String)],
        remove: &[String],
    ) -> Result<()> {
        let body = messages::alter_topic_configs_request(name, set, remove);
        let response = self
            .cluster
            .request_any(ApiKey::AlterTopicConfigs, &body)
            .await?;
        messages::alter_topic_configs_response(response.body(), name)
    }

    pub async fn list_topics(&self) -> Result<Vec<TopicSummary>> {
        let body = messages::list_topics_request();
        let response = self.cluster.request_any(ApiKey::ListTopics, &body).await?;
        messages::list_topics_response(response.body())
    }

    pub async fn describe_topic(&self, name: &str) -> Result<TopicDescription> {
        let body = messages::describe_topic_request(name);
        let response = self
            .cluster
            .request_any(ApiKey::DescribeTopic, &body)
            .await?;
        messages::describe_topic_response(response.body())
    }

    /// Fresh metadata for the whole cluster.
    pub async fn metadata(&self) -> Result<Arc<ClusterMetadata>> {
        self.cluster.refresh_metadata().await
    }
}

/// Consumer groups.
impl Admin {
    fn coordinator(&self, group_id: &str) -> Coordinator {
        Coordinator::new(self.cluster.clone(), group_id, RetryPolicy::default())
    }

    /// Where the group's coordinator is (it is created on first use).
    pub async fn find_coordinator(&self, group_id: &str) -> Result<CoordinatorInfo> {
        self.coordinator(group_id).find().await
    }

    /// Where a transactional id's coordinator is.
    pub async fn find_transaction_coordinator(
        &self,
        transactional_id: &str,
    ) -> Result<CoordinatorInfo> {
        Coordinator::for_transaction(
            self.cluster.clone(),
            transactional_id,
            RetryPolicy::default(),
        )
        .find()
        .await
    }

    /// Every group of the cluster, sorted by id: each broker in fresh
    /// metadata lists the groups it coordinates. Groups live on shards, so
    /// every shard endpoint a broker advertises is asked (its main port when
    /// it advertises none); a group listed twice (by two shards of a broker
    /// that answers for all of them, or while its coordinator moves) appears
    /// once, as first listed. Fails if an endpoint cannot answer, rather than
    /// return a list that silently misses groups.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        let body = messages::list_groups_request();
        let mut merged: BTreeMap<String, GroupListing> = BTreeMap::new();
        for group in self
            .ask_every_broker(ApiKey::ListGroups, &body, messages::list_groups_response)
            .await?
        {
            merged.entry(group.group_id.clone()).or_insert(group);
        }
        Ok(merged.into_values().collect())
    }

    /// Every transactional id the cluster's coordinators hold, by id;
    /// `states` (Empty, Ongoing, PrepareCommit, ...) filters, empty for all.
    pub async fn list_transactions(&self, states: &[&str]) -> Result<Vec<TransactionDescription>> {
        let body = messages::list_transactions_request(states);
        let mut merged: BTreeMap<String, TransactionDescription> = BTreeMap::new();
        for t in self
            .ask_every_broker(
                ApiKey::ListTransactions,
                &body,
                messages::list_transactions_response,
            )
            .await?
        {
            merged.entry(t.transactional_id.clone()).or_insert(t);
        }
        Ok(merged.into_values().collect())
    }

    /// One transactional id, from its coordinator: state, producer id and
    /// epoch, timeout, the open transaction's partitions and start time.
    pub async fn describe_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<TransactionDescription> {
        let body = messages::describe_transaction_request(transactional_id);
        Coordinator::for_transaction(
            self.cluster.clone(),
            transactional_id,
            RetryPolicy::default(),
        )
        .call(
            ApiKey::DescribeTransaction,
            &body,
            messages::describe_transaction_response,
        )
        .await
    }

    /// Sends a listing request to every shard endpoint of every broker and
    /// concatenates the answers (each lists what its broker coordinates).
    async fn ask_every_broker<T>(
        &self,
        api: ApiKey,
        body: &[u8],
        decode: impl Fn(&[u8]) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let metadata = self.cluster.refresh_metadata().await?;
        let mut addresses = BTreeSet::new();
        for broker in &metadata.brokers {
            if broker.shards.is_empty() {
                addresses.insert(broker.address());
            }
            addresses.extend(broker.shards.iter().map(|s| broker.shard_address(s.shard)));
        }
        let mut out = Vec::new();
        for address in addresses {
            out.extend(self.list_at(&address, api, body, &decode).await?);
        }
        Ok(out)
    }

    async fn list_at<T>(
        &self,
        address: &str,
        api: ApiKey,
        body: &[u8],
        decode: &impl Fn(&[u8]) -> Result<Vec<T>>,
    ) -> Result<Vec<T>> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let answer = self
                .cluster
                .request_to(address, api, body, &[])
                .await
                .and_then(|response| decode(response.body()));
            match answer {
                Err(error) if error.is_retriable() && attempt < LIST_GROUPS_ATTEMPTS_MAX => {
                    tokio::time::sleep(Duration::from_millis(ADMIN_RETRY_BACKOFF_MS)).await;
                }
                other => return other,
            }
        }
    }

    /// The group's members and committed offsets, and per partition (every
    /// partition with a committed offset or an owner) its log end offset
    /// and how far the group is behind, in records and in time.
    pub async fn describe_group(&self, group_id: &str) -> Result<GroupDescription> {
        let body = messages::describe_group_request(group_id);
        let mut description = self
            .coordinator(group_id)
            .call(
                ApiKey::DescribeGroup,
                &body,
                messages::describe_group_response,
            )
            .await?;
        description.partitions = self.partition_lags(&description).await;
        Ok(description)
    }

    async fn partition_lags(
        &self,
        description: &GroupDescription,
    ) -> Vec<GroupPartitionDescription> {
        let mut partitions: BTreeSet<TopicPartition> =
            description.offsets.keys().cloned().collect();
        for member in &description.members {
            partitions.extend(member.assigned.iter().cloned());
            partitions.extend(member.pending_revocation.iter().cloned());
        }
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in &partitions {
            by_topic.entry(&tp.topic).or_default().push(tp.partition);
        }
        let mut ends: BTreeMap<TopicPartition, i64> = BTreeMap::new();
        for (topic, indexes) in by_topic {
            // A topic whose leaders cannot be asked shows no end and no lag.
            if let Ok(found) = self.list_offsets(topic, &indexes, TIMESTAMP_LATEST).await {
                ends.extend(
                    found
                        .into_iter()
                        .map(|(p, end)| (TopicPartition::new(topic, p), end)),
                );
            }
        }
        let now_ms = wall_clock_ms();
        let mut out = Vec::with_capacity(partitions.len());
        for (index, tp) in partitions.into_iter().enumerate() {
            let committed_offset = description.offsets.get(&tp).map(|c| c.offset);
            let log_end_offset = ends.get(&tp).copied().filter(|end| *end >= 0);
            let lag_records = committed_offset
                .zip(log_end_offset)
                .map(|(committed, end)| (end - committed).max(0));
            let lag_ms = match (committed_offset, lag_records) {
                (_, Some(0)) => Some(0),
                (Some(committed), Some(_)) if index < LAG_TIME_PARTITIONS_MAX => self
                    .record_timestamp(&tp, committed)
                    .await
                    .ok()
                    .flatten()
                    .map(|timestamp_ms| now_ms.saturating_sub(timestamp_ms).max(0)),
                _ => None,
            };
            out.push(GroupPartitionDescription {
                owner: description.owner_of(&tp).map(str::to_owned),
                topic: tp.topic,
                partition: tp.partition,
                committed_offset,
                log_end_offset,
                lag_records,
                lag_ms,
            });
        }
        out
    }

    /// The timestamp of the first record at or after `offset`, read with a
    /// one-partition fetch that does not wait; `None` when there is none.
    async fn record_timestamp(&self, tp: &TopicPartition, offset: i64) -> Result<Option<i64>> {
        let address = self
            .cluster
            .metadata()
            .leader_address(&tp.topic, tp.partition)?;
        let entry = FetchEntry {
            topic: tp.topic.clone(),
            partition: tp.partition,
            fetch_offset: offset,
            max_bytes: LAG_FETCH_BYTES_MAX,
        };
        let body = messages::fetch_request(
            0,
            1,
            LAG_FETCH_BYTES_MAX,
            IsolationLevel::ReadUncommitted,
            &[entry],
        );
        let response = self
            .cluster
            .request_to(&address, ApiKey::Fetch, &body, &[])
            .await?;
        let payload = response.payload();
        let Some(data) = messages::fetch_response(response.body(), &payload)?
            .into_iter()
            .find(|d| d.topic == tp.topic && d.partition == tp.partition)
        else {
            return Ok(None);
        };
        if !data.error.is_ok() {
            return Err(ClientError::broker(data.error, None));
        }
        let decoded = decode_records(
            &tp.topic,
            tp.partition,
            &data.records,
            offset,
            LAG_FETCH_BYTES_MAX as usize,
            ConsumerConfig::default().decompressed_bytes_max,
            &[],
        )?;
        Ok(decoded.records.first().map(|r| r.timestamp_ms))
    }

    async fn list_offsets(
        &self,
        topic: &str,
        partitions: &[i32],
        timestamp_ms: i64,
    ) -> Result<BTreeMap<i32, i64>> {
        list_offsets(
            &self.cluster,
            topic,
            partitions,
            timestamp_ms,
            IsolationLevel::ReadUncommitted,
            Duration::from_millis(ADMIN_RETRY_BACKOFF_MS),
            Duration::from_millis(crate::consumer::LIST_OFFSETS_RETRY_MS_MAX),
        )
        .await
    }

    /// Deletes a group without members and all its committed offsets.
    pub async fn delete_group(&self, group_id: &str) -> Result<()> {
        let body = messages::delete_group_request(group_id);
        self.coordinator(group_id)
            .call(ApiKey::DeleteGroup, &body, messages::delete_group_response)
            .await
    }

    /// Deletes the group's committed offsets of `topic`, which no member
    /// may subscribe to (GROUP_SUBSCRIBED_TO_TOPIC otherwise).
    pub async fn delete_group_offsets(&self, group_id: &str, topic: &str) -> Result<()> {
        let body = messages::delete_group_offsets_request(group_id, topic);
        self.coordinator(group_id)
            .call(
                ApiKey::DeleteGroupOffsets,
                &body,
                messages::delete_group_offsets_response,
            )
            .await
    }

    /// The group's committed offsets: of `partitions`, or all of them when
    /// `None`. Partitions without one are absent.
    pub async fn fetch_committed(
        &self,
        group_id: &str,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<BTreeMap<TopicPartition, CommittedOffset>> {
        let body = messages::offset_fetch_request(group_id, partitions);
        self.coordinator(group_id)
            .call(ApiKey::OffsetFetch, &body, messages::offset_fetch_response)
            .await
    }

    /// Commits `offsets` for a group without members, as a tool does (empty
    /// member id, epoch -1); NON_EMPTY_GROUP while it has members.
    pub async fn commit_group_offsets(
        &self,
        group_id: &str,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<()> {
        let body = messages::offset_commit_request(group_id, "", MemberEpoch::LEAVE, offsets);
        self.coordinator(group_id)
            .call(
                ApiKey::OffsetCommit,
                &body,
                messages::offset_commit_response,
            )
            .await
    }

    /// Moves the group's committed offsets of every partition of `topic`
    /// to `to`, computed here with ListOffsets, and commits them as a tool
    /// (the group must have no members) unless `dry_run`. Returns each
    /// partition's old and new offset, by partition.
    pub async fn reset_offsets(
        &self,
        group_id: &str,
        topic: &str,
        to: ResetTo,
        dry_run: bool,
    ) -> Result<Vec<PartitionReset>> {
        let metadata = self.cluster.topic(topic, 3).await?;
        let partitions: Vec<i32> = metadata.partitions.iter().map(|p| p.partition).collect();
        if partitions.is_empty() {
            return Err(ClientError::UnknownTopic(topic.to_owned()));
        }
        let topic_partitions: Vec<TopicPartition> = partitions
            .iter()
            .map(|&p| TopicPartition::new(topic, p))
            .collect();
        let old = self
            .fetch_committed(group_id, Some(&topic_partitions))
            .await?;
        let new = self.reset_targets(topic, &partitions, to).await?;
        let resets: Vec<PartitionReset> = partitions
            .iter()
            .map(|&p| PartitionReset {
                partition: p,
                old_offset: old.get(&TopicPartition::new(topic, p)).map(|c| c.offset),
                new_offset: new[&p],
            })
            .collect();
        if !dry_run {
            let offsets: BTreeMap<TopicPartition, i64> = resets
                .iter()
                .map(|r| (TopicPartition::new(topic, r.partition), r.new_offset))
                .collect();
            self.commit_group_offsets(group_id, &offsets).await?;
        }
        Ok(resets)
    }

    /// The offset `to` names in each partition.
    async fn reset_targets(
        &self,
        topic: &str,
        partitions: &[i32],
        to: ResetTo,
    ) -> Result<BTreeMap<i32, i64>> {
        let mut targets = match to {
            ResetTo::Earliest => {
                self.list_offsets(topic, partitions, TIMESTAMP_EARLIEST)
                    .await?
            }
            ResetTo::Latest => {
                self.list_offsets(topic, partitions, TIMESTAMP_LATEST)
                    .await?
            }
            ResetTo::Offset(offset) => {
                let starts = self
                    .list_offsets(topic, partitions, TIMESTAMP_EARLIEST)
                    .await?;
                let ends = self
                    .list_offsets(topic, partitions, TIMESTAMP_LATEST)
                    .await?;
                partitions
                    .iter()
                    .map(|p| (*p, clamp_offset(offset, starts[p], ends[p])))
                    .collect()
            }
            ResetTo::Timestamp(_) | ResetTo::Back(_) => {
                let timestamp_ms = to
                    .timestamp_ms(wall_clock_ms())
                    .expect("a time target has a timestamp");
                let mut found = self.list_offsets(topic, partitions, timestamp_ms).await?;
                // No record at or after the time: the log end.
                let past_end: Vec<i32> = found
                    .iter()
                    .filter(|(_, offset)| **offset < 0)
                    .map(|(p, _)| *p)
                    .collect();
                if !past_end.is_empty() {
                    found.extend(
                        self.list_offsets(topic, &past_end, TIMESTAMP_LATEST)
                            .await?,
                    );
                }
                found
            }
        };
        targets.retain(|p, _| partitions.contains(p));
        for p in partitions {
            let offset = targets.get(p).copied().unwrap_or(-1);
            if offset < 0 {
                return Err(ClientError::MalformedResponse(format!(
                    "no offset for partition {p} of `{topic}`"
                )));
            }
        }
        Ok(targets)
    }
}

/// Wall-clock time in ms since the epoch, for lag in time and resets to a
/// time; 0 if the clock is before 1970.
fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
