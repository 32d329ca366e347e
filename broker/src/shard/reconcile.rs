//! From metadata to replicas: shard 0 applies each controller update on every
//! shard; each shard then makes its replicas match `desired_replicas`, a pure
//! function of the view, this broker and this shard.

use std::collections::BTreeMap;
use std::rc::Rc;

use protocol::control::messages::MetadataUpdate;
use protocol::BrokerId;

use super::{Replica, Role, Shard, ShardOp, METADATA_SHARD};
use crate::cluster_view::{min_insync, topic_log_config, ClusterView, ViewError};
use crate::log::LogConfig;
use crate::partition::PartitionKey;
use crate::runtime;

impl Shard {
    /// Shard 0 only: applies a controller update on every other shard, then
    /// here. The update is checked against a copy first, so a bad one is
    /// refused before any shard changes.
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
        for call in calls {
            call.await;
        }
        let _gate = self.apply_gate.enter().await;
        *self.view.borrow_mut() = next;
        self.after_view_change(broker_epoch).await;
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
        self.after_view_change(broker_epoch).await;
    }

    /// With the apply gate held: replicas, fetchers and serving follow the
    /// view just installed.
    pub(super) async fn after_view_change(self: &Rc<Self>, broker_epoch: u64) {
        self.reconcile().await;
        self.ensure_fetchers();
        self.sync_hosted::<crate::group::coordinator::GroupCoordinator>();
        self.sync_hosted::<crate::txn::coordinator::TxnCoordinator>();
        self.reconciled_version.set(self.view.borrow().version.0);
        let me = self.broker_id();
        if !self.is_serving()
            && self
                .view
                .borrow()
                .is_registered_and_unfenced(me, broker_epoch)
        {
            self.serving.advance(1);
        }
    }

    /// Makes this shard's replicas match the view: opens replicas placed
    /// here, updates roles, and removes replicas of deleted topics.
    pub(super) async fn reconcile(&self) {
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
        for (key, desired) in wanted {
            let DesiredReplica {
                topic_id,
                role,
                log_config,
            } = desired;
            let existing = self.replicas.borrow().get(&key).cloned();
            match existing {
                Some(replica) => {
                    if replica.log.config() != log_config {
                        match replica.log.set_config(log_config) {
                            Ok(()) => {
                                tracing::info!(topic = %key.topic, partition = key.partition, "topic config applied")
                            }
                            Err(e) => {
                                tracing::error!(topic = %key.topic, partition = key.partition, error = %e, "topic config refused; keeping the previous one")
                            }
                        }
                    }
                    self.set_role(&key, &replica, role)
                }
                None => match self.open_replica(&key, topic_id, log_config).await {
                    Ok(log) => {
                        let replica = Rc::new(Replica::new(self.broker_id(), topic_id, log, &role));
                        self.replicas
                            .borrow_mut()
                            .insert(key.clone(), replica.clone());
                        self.set_role(&key, &replica, role);
                    }
                    Err(e) => {
                        self.metrics.on_storage_error();
                        tracing::error!(topic = %key.topic, partition = key.partition, error = %e, "cannot open replica");
                    }
                },
            }
        }
    }
}

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
