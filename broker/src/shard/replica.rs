//! A partition replica this shard owns: its log, the watermarks its waiters
//! wait on, and its replication state machine (`replication::replica`);
//! role changes, and opening and removing its log.

use std::cell::{Ref, RefCell};
use std::rc::Rc;

use super::{Role, Shard, TOPIC_ID_FILE};
use crate::cluster_view::partition_dir;
use crate::log::{LogError, PartitionLog};
use crate::partition::PartitionKey;
use crate::replication::epochs::EpochHistory;
use crate::replication::replica::ReplicaCore;
use crate::runtime::{self, Watermark};
use protocol::{BrokerId, LeaderEpoch};

#[derive(Debug)]
pub struct Replica {
    pub topic_id: u64,
    pub log: Rc<PartitionLog>,
    /// The log end offset, for follower fetch long-polls to wait on.
    pub log_end: Watermark,
    /// Offsets below it are on every in-sync replica; consumers read only
    /// below it and wait on it.
    pub high_watermark: Watermark,
    /// Role, leader state, epoch history, ISR change in flight.
    pub core: RefCell<ReplicaCore>,
    /// Counts role changes: work that awaited (a follower's cut, an acks=all
    /// wait) checks it did not change meanwhile, and waits on it to learn
    /// of a change at once.
    pub role_version: Watermark,
}

impl Replica {
    /// A replica of broker `me` over an opened log, in the role `role` gives
    /// it before its first role change (`Role::opened`).
    pub fn new(me: BrokerId, topic_id: u64, log: Rc<PartitionLog>, role: &Role) -> Replica {
        let log_end = Watermark::new(log.log_end_offset().0);
        // Only the latest epoch is known without a history file: a follower
        // that asks about older ones is cut back further than needed, never
        // too little.
        let fallback = if log.log_end_offset() > log.log_start_offset() {
            EpochHistory::from_entries(vec![(log.latest_epoch().0, log.log_start_offset().0)])
        } else {
            EpochHistory::default()
        };
        let epochs = EpochHistory::load(log.dir(), log.log_end_offset().0, fallback);
        Replica {
            topic_id,
            log,
            log_end,
            high_watermark: Watermark::new(0),
            core: RefCell::new(ReplicaCore::new(me, role, epochs)),
            role_version: Watermark::new(0),
        }
    }

    pub fn role(&self) -> Ref<'_, Role> {
        Ref::map(self.core.borrow(), ReplicaCore::role)
    }

    /// Whether this broker still leads the partition at `leader_epoch`.
    pub fn leads_at(&self, leader_epoch: LeaderEpoch) -> bool {
        self.core.borrow().leads_at(leader_epoch)
    }

    /// Saves the epoch history after it changed.
    pub(super) fn save_epochs(&self, shard: &Shard) {
        if let Err(e) = self.core.borrow().epochs().save(self.log.dir()) {
            shard.metrics.on_storage_error();
            tracing::warn!(error = %e, dir = %self.log.dir().display(), "saving the leader epoch history failed");
        }
    }
}

impl Shard {
    /// Moves a replica to the role the metadata gives it
    /// (`ReplicaCore::apply_role`); a follower is fetched for by
    /// `shard::fetcher`.
    pub(super) fn set_role(&self, key: &PartitionKey, replica: &Replica, role: Role) {
        let old = replica.role().clone();
        let end = replica.log.log_end_offset().0;
        let now_ms = self.clock.now_ms().max(0) as u64;
        let hw = replica.high_watermark.get();
        let applied = replica
            .core
            .borrow_mut()
            .apply_role(role.clone(), end, hw, now_ms);
        let Some(applied) = applied else {
            if role != old {
                tracing::debug!(topic = %key.topic, partition = key.partition, held_leader_epoch = %old.leader_epoch, held_partition_epoch = %old.partition_epoch, got_leader_epoch = %role.leader_epoch, got_partition_epoch = %role.partition_epoch, "ignoring an older role");
            }
            return;
        };
        if role.leader != old.leader || role.leader_epoch != old.leader_epoch {
            tracing::info!(topic = %key.topic, partition = key.partition, leader = role.leader, leader_epoch = %role.leader_epoch, isr = ?role.isr, "replica role changed");
        }
        if applied.epochs_changed {
            replica.save_epochs(self);
        }
        replica.role_version.advance(replica.role_version.get() + 1);
        self.update_high_watermark(replica);
    }

    pub(super) async fn open_replica(
        &self,
        key: &PartitionKey,
        topic_id: u64,
        log_config: crate::log::LogConfig,
    ) -> Result<Rc<PartitionLog>, LogError> {
        let dir = partition_dir(&self.config.data_dir, &key.topic, key.partition);
        let marker = dir.join(TOPIC_ID_FILE);
        let read = {
            let marker = marker.clone();
            runtime::blocking(move || std::fs::read_to_string(marker)).await
        };
        match read {
            Ok(text) if text.trim() == topic_id.to_string() => {}
            Ok(text) => {
                tracing::warn!(dir = %dir.display(), old_topic_id = %text.trim(), topic_id, "removing the data of a deleted topic of the same name");
                let old = dir.clone();
                runtime::blocking(move || std::fs::remove_dir_all(old))
                    .await
                    .map_err(|e| LogError::io(&dir, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LogError::io(&marker, e)),
        }
        let log = PartitionLog::open(&dir, log_config, self.clock.clone()).await?;
        if !marker.exists() {
            let owned = dir.clone();
            runtime::blocking(move || {
                crate::log::write_atomically(&owned, TOPIC_ID_FILE, topic_id.to_string().as_bytes())
            })
            .await
            .map_err(|e| LogError::io(&marker, e))?;
        }
        Ok(log)
    }

    pub(super) async fn remove_replica(&self, key: &PartitionKey) {
        let replica = self.replicas.borrow_mut().remove(key);
        self.cache.borrow_mut().remove_partition(key);
        if let Some(replica) = replica {
            tracing::info!(topic = %key.topic, partition = key.partition, "removing replica");
            if let Err(e) = replica.log.close().await {
                tracing::warn!(error = %e, topic = %key.topic, partition = key.partition, "closing a removed replica failed");
            }
            let dir = replica.log.dir().to_path_buf();
            if let Err(e) = runtime::blocking(move || std::fs::remove_dir_all(dir)).await {
                tracing::warn!(error = %e, dir = %replica.log.dir().display(), "removing a replica's data failed");
            }
        }
    }
}
