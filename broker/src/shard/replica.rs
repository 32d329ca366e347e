//! A partition replica this shard owns, its role changes (by
//! `replication::role`), and opening and removing its log.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use super::{Role, Shard, TOPIC_ID_FILE};
use crate::cluster_view::partition_dir;
use crate::log::{LogError, PartitionLog};
use crate::partition::PartitionKey;
use crate::replication::epochs::EpochHistory;
use crate::replication::leader::LeaderState;
use crate::runtime::{self, Watermark};
use protocol::LeaderEpoch;

#[derive(Debug)]
pub struct Replica {
    pub topic_id: u64,
    pub log: Rc<PartitionLog>,
    /// The log end offset, for follower fetch long-polls to wait on.
    pub log_end: Watermark,
    /// Offsets below it are on every in-sync replica; consumers read only
    /// below it and wait on it.
    pub high_watermark: Watermark,
    pub role: RefCell<Role>,
    /// While leading: the followers' progress.
    pub leader_state: RefCell<Option<LeaderState>>,
    pub epochs: RefCell<EpochHistory>,
    /// An AlterIsr for this partition is on its way; no second one meanwhile.
    pub alter_isr_in_flight: Cell<bool>,
    /// Counts role changes: work that awaited (a follower's cut, an acks=all
    /// wait) checks it did not change meanwhile, and waits on it to learn
    /// of a change at once.
    pub role_version: Watermark,
}

impl Replica {
    /// A replica over an opened log, in the role `role` gives it before its
    /// first role change (`Role::opened`).
    pub fn new(topic_id: u64, log: Rc<PartitionLog>, role: &Role) -> Replica {
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
            role: RefCell::new(Role::opened(role)),
            leader_state: RefCell::new(None),
            epochs: RefCell::new(epochs),
            alter_isr_in_flight: Cell::new(false),
            role_version: Watermark::new(0),
        }
    }

    /// Whether this broker still leads the partition at `leader_epoch`.
    pub fn leads_at(&self, leader_epoch: LeaderEpoch) -> bool {
        let role = self.role.borrow();
        role.leader && role.leader_epoch == leader_epoch
    }
}

impl Shard {
    /// Moves a replica to the role the metadata gives it. A new leadership
    /// (or a new epoch of it) starts its epoch at the log end and tracks its
    /// followers afresh; a follower drops the leader state and is fetched for
    /// by `shard::fetcher`.
    pub(super) fn set_role(&self, key: &PartitionKey, replica: &Replica, role: Role) {
        use crate::replication::role::{role_change, RoleChange};
        let old = replica.role.borrow().clone();
        let new_leadership = match role_change(&old, &role) {
            RoleChange::Unchanged => return,
            RoleChange::Stale => {
                tracing::debug!(topic = %key.topic, partition = key.partition, held_leader_epoch = %old.leader_epoch, held_partition_epoch = %old.partition_epoch, got_leader_epoch = %role.leader_epoch, got_partition_epoch = %role.partition_epoch, "ignoring an older role");
                return;
            }
            RoleChange::Apply { new_leadership, .. } => new_leadership,
        };
        if role.leader != old.leader || role.leader_epoch != old.leader_epoch {
            tracing::info!(topic = %key.topic, partition = key.partition, leader = role.leader, leader_epoch = %role.leader_epoch, isr = ?role.isr, "replica role changed");
        }
        *replica.role.borrow_mut() = role.clone();
        if new_leadership {
            let end = replica.log.log_end_offset().0;
            self.note_epoch(replica, role.leader_epoch.0, end);
            let now_ms = self.clock.now_ms().max(0) as u64;
            let state = LeaderState::new(
                self.broker_id(),
                &role.replicas,
                replica.high_watermark.get().min(end),
                now_ms,
            );
            *replica.leader_state.borrow_mut() = Some(state);
            replica.alter_isr_in_flight.set(false);
        } else if !role.leader {
            *replica.leader_state.borrow_mut() = None;
        }
        replica.role_version.advance(replica.role_version.get() + 1);
        self.update_high_watermark(replica);
    }

    /// Opens (or creates) a replica's log, first removing a directory left by
    /// an older topic of the same name.
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
