//! From metadata to replicas: shard 0 applies each controller update on every
//! shard; each shard then makes its replicas match `desired_replicas`, a pure
//! function of the view, this broker and this shard.

use std::collections::BTreeMap;
use std::rc::Rc;

use protocol::control::messages::MetadataUpdate;
use protocol::{BrokerId, Offset};

use super::{Replica, Role, Shard, ShardOp, METADATA_SHARD, TOPIC_ID_FILE};
use crate::cluster_view::{
    min_insync, partition_dir, topic_log_config, topics_dir, ClusterView, ViewError,
};
use crate::log::{create_empty_logs, EmptyLog, LogConfig};
use crate::partition::PartitionKey;
use crate::replication::epochs::{EpochHistory, EPOCH_FILE};
use crate::runtime;

impl Shard {
    /// Shard 0 only: applies a controller update on every shard. The update
    /// is checked against a copy first, so a bad one is refused before any
    /// shard changes. Shard 0 applies it alongside the others (opening
    /// thousands of replicas takes each shard seconds) but counts it as
    /// reconciled only once every other shard has: an admin request waiting
    /// on shard 0's `reconciled_version`, or the heartbeat asking to be
    /// unfenced, then knows every shard serves the update.
    pub async fn publish_metadata(self: Rc<Self>, update: MetadataUpdate) -> Result<(), ViewError> {
        assert_eq!(self.id, METADATA_SHARD, "metadata arrives on shard 0");
        let mut next = self.view.borrow().clone();
        next.apply(update.clone())?;
        let broker_epoch = self.broker_epoch.get();
        let calls: Vec<_> = (0..self.count)
            .filter(|&to| to != self.id)
            .map(|to| {
                let (shard, update) = (self.clone(), update.clone());
                runtime::spawn(async move {
                    shard
                        .call(
                            to,
                            ShardOp::ApplyMetadata {
                                update,
                                broker_epoch,
                            },
                        )
                        .await
                })
            })
            .collect();
        let version = {
            let _gate = self.apply_gate.enter().await;
            *self.view.borrow_mut() = next;
            self.after_view_change(broker_epoch).await
        };
        for call in calls {
            call.await;
        }
        self.reconciled_version.set(version);
        Ok(())
    }

    pub(super) async fn apply_metadata(self: &Rc<Self>, update: MetadataUpdate, broker_epoch: u64) {
        let _gate = self.apply_gate.enter().await;
        self.broker_epoch.set(broker_epoch);
        if let Err(e) = self.view.borrow_mut().apply(update) {
            // Shard 0 checked this update against the same view.
            panic!(
                "shard {}: metadata update refused after check: {e}",
                self.id
            );
        }
        let version = self.after_view_change(broker_epoch).await;
        self.reconciled_version.set(version);
    }

    /// With the apply gate held: replicas, fetchers and serving follow the
    /// view just installed. Returns the view's version, which the caller
    /// records as reconciled when it may.
    pub(super) async fn after_view_change(self: &Rc<Self>, broker_epoch: u64) -> u64 {
        self.reconcile().await;
        self.ensure_fetchers();
        self.sync_hosted::<crate::group::coordinator::GroupCoordinator>();
        self.sync_hosted::<crate::txn::coordinator::TxnCoordinator>();
        let me = self.broker_id();
        if !self.is_serving()
            && self
                .view
                .borrow()
                .is_registered_and_unfenced(me, broker_epoch)
        {
            self.serving.advance(1);
        }
        self.view.borrow().version.0
    }

    /// Makes this shard's replicas match the view: opens replicas placed
    /// here, updates roles, and removes replicas of deleted topics.
    pub(super) async fn reconcile(self: &Rc<Self>) {
        let (wanted, unusable) = desired_replicas(
            &self.view.borrow(),
            &self.config.log,
            self.broker_id(),
            self.id,
        );
        for (topic, reason) in unusable {
            tracing::error!(topic = %topic, error = %reason, "topic config unusable here; not hosting it");
        }
        let gone: Vec<PartitionKey> = self
            .replicas
            .borrow()
            .iter()
            .filter(|(k, r)| wanted.get(*k).is_none_or(|d| d.topic_id != r.topic_id))
            .map(|(k, _)| k.clone())
            .collect();
        for key in gone {
            self.remove_replica(&key).await;
        }
        let mut to_open = Vec::new();
        for (key, desired) in wanted {
            let existing = self.replicas.borrow().get(&key).cloned();
            let Some(replica) = existing else {
                to_open.push((key, desired));
                continue;
            };
            if replica.log.config() != desired.log_config {
                match replica.log.set_config(desired.log_config) {
                    Ok(()) => {
                        tracing::info!(topic = %key.topic, partition = key.partition, "topic config applied")
                    }
                    Err(e) => {
                        tracing::error!(topic = %key.topic, partition = key.partition, error = %e, "topic config refused; keeping the previous one")
                    }
                }
            }
            self.set_role(&key, &replica, desired.role)
        }
        // New replicas' directories are made together first (a few file
        // system commits for all of them instead of several each); then the
        // replicas open a group at a time, which for existing logs overlaps
        // their recovery syncs. Results are taken in key order, so a seed
        // replays exactly.
        let made: Vec<Option<bool>> = match self.create_empty_logs(&to_open).await {
            Some(made) => made.into_iter().map(Some).collect(),
            None => vec![None; to_open.len()],
        };
        let groups = to_open
            .chunks(REPLICA_OPENS_IN_FLIGHT_MAX)
            .zip(made.chunks(REPLICA_OPENS_IN_FLIGHT_MAX));
        for (group, made) in groups {
            let opens: Vec<_> = group
                .iter()
                .zip(made)
                .map(|((key, desired), &made)| {
                    let (shard, key) = (self.clone(), key.clone());
                    let (topic_id, log_config) = (desired.topic_id, desired.log_config.clone());
                    runtime::spawn(async move {
                        shard.open_replica(&key, topic_id, log_config, made).await
                    })
                })
                .collect();
            for (((key, desired), open), made) in group.iter().zip(opens).zip(made) {
                match open.await {
                    Ok(log) => {
                        let replica = Rc::new(Replica::new(
                            self.broker_id(),
                            desired.topic_id,
                            log,
                            &desired.role,
                            self.epoch_writer.clone(),
                        ));
                        self.replicas
                            .borrow_mut()
                            .insert(key.clone(), replica.clone());
                        self.set_role(key, &replica, desired.role.clone());
                        if made.is_none() {
                            // What the failed pass wrote may not be durable.
                            replica.save_epochs();
                        }
                    }
                    Err(e) => {
                        self.metrics.on_storage_error();
                        tracing::error!(topic = %key.topic, partition = key.partition, error = %e, "cannot open replica");
                    }
                }
            }
        }
    }

    /// Makes the directories of the replicas in `group` that have none yet
    /// (`log::create_empty_logs`): an empty log, its topic id, and for a
    /// leader the epoch history its first role change would save. Returns
    /// which it made, or `None` if it failed (then no directory it may have
    /// made is vouched for, and each replica opens the usual way).
    async fn create_empty_logs(
        &self,
        group: &[(PartitionKey, DesiredReplica)],
    ) -> Option<Vec<bool>> {
        if group.is_empty() {
            // Nothing to wait for behind the blocking threads' other work.
            return Some(Vec::new());
        }
        let logs: Vec<EmptyLog> = group
            .iter()
            .map(|(key, desired)| {
                let mut files = vec![(TOPIC_ID_FILE, desired.topic_id.to_string().into_bytes())];
                if desired.role.leader {
                    let mut epochs = EpochHistory::default();
                    epochs.assign(desired.role.leader_epoch, Offset::ZERO);
                    files.push((EPOCH_FILE, epochs.encode().into_bytes()));
                }
                EmptyLog {
                    dir: partition_dir(&self.config.data_dir, &key.topic, key.partition),
                    files,
                }
            })
            .collect();
        let parent = topics_dir(&self.config.data_dir);
        match runtime::blocking(move || create_empty_logs(&parent, &logs)).await {
            Ok(made) => Some(made),
            Err(e) => {
                self.metrics.on_storage_error();
                tracing::error!(error = %e, "cannot make the directories of new replicas; opening them one by one");
                None
            }
        }
    }
}

/// Replicas a shard opens at once when metadata places many on it (a topic
/// of thousands of partitions, or a restart): enough to fill the blocking
/// threads, few enough that one update does not hold thousands of files and
/// buffers half-open.
pub const REPLICA_OPENS_IN_FLIGHT_MAX: usize = 256;

/// A replica the metadata places on this shard, as it should be.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredReplica {
    pub topic_id: u64,
    pub role: Role,
    pub log_config: LogConfig,
}

/// The replicas `view` places on shard `shard` of broker `me`, each with its
/// role and log config; and the topics whose config this broker cannot use
/// (with why), which it does not host.
pub fn desired_replicas(
    view: &ClusterView,
    log_defaults: &LogConfig,
    me: BrokerId,
    shard: usize,
) -> (
    BTreeMap<PartitionKey, DesiredReplica>,
    Vec<(String, String)>,
) {
    // Ordered, so replicas open in the same order every time (a seed
    // replays exactly).
    let mut wanted = BTreeMap::new();
    let mut unusable = Vec::new();
    for topic in view.topics.values() {
        let log_config = match topic_log_config(log_defaults, &topic.config) {
            Ok(c) => c,
            Err(e) => {
                unusable.push((topic.name.clone(), e.message));
                continue;
            }
        };
        for (index, partition) in topic.partitions.iter().enumerate() {
            let Some(replica) = partition.replica_on(me) else {
                continue;
            };
            if usize::from(replica.shard.0) != shard {
                continue;
            }
            let key = PartitionKey {
                topic: topic.name.clone(),
                partition: i32::try_from(index).expect("partition count bounded"),
            };
            let leader_endpoint = partition.leader.filter(|&l| l != me).and_then(|l| {
                let shard = partition.replica_on(l)?.shard.0;
                view.brokers
                    .get(&l)?
                    .endpoints
                    .shards
                    .get(usize::from(shard))
                    .cloned()
            });
            let role = Role {
                leader: partition.leader == Some(me),
                leader_epoch: partition.leader_epoch,
                partition_epoch: partition.partition_epoch,
                replicas: partition.replicas.iter().map(|r| r.broker_id).collect(),
                isr: partition.isr.clone(),
                min_insync: min_insync(&topic.config),
                leader_endpoint,
            };
            wanted.insert(
                key,
                DesiredReplica {
                    topic_id: topic.id.0,
                    role,
                    log_config: log_config.clone(),
                },
            );
        }
    }
    (wanted, unusable)
}
