//! A partition replica this shard owns: its log, the watermarks its waiters
//! wait on, and its replication state machine (`replication::replica`);
//! role changes, and opening and removing its log.

use std::cell::{Cell, Ref, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

use super::maintenance::FailureBackoff;
use super::{Role, Shard, TOPIC_ID_FILE};
use crate::cluster_view::{partition_dir, topics_dir};
use crate::log::{sync_dir, write_all_atomically, LogError, PartitionLog};
use crate::partition::PartitionKey;
use crate::replication::epochs::{EpochHistory, EPOCH_FILE};
use crate::replication::replica::ReplicaCore;
use crate::runtime::{self, Watermark};
use protocol::{BrokerId, LeaderEpoch, Offset};

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
    /// Writes the epoch history to `leader-epoch.checkpoint`.
    pub epoch_saver: Rc<EpochSaver>,
    /// Its log cleaner's record (compacted topics).
    pub cleaning: RefCell<Cleaning>,
    /// In the shard's maintenance queue (`Shard::queue_maintenance`).
    pub maintenance_queued: Cell<bool>,
    /// Retry delays and warnings while its log's maintenance fails.
    pub maintenance_backoff: RefCell<FailureBackoff>,
}

/// When the cleaner last ran over a replica's log, and whether an error
/// stopped it there.
#[derive(Clone, Debug, Default)]
pub struct Cleaning {
    pub last_pass_ms: Option<i64>,
    /// Set by a cleaner error; the replica is skipped until the broker
    /// restarts (or the replica is reopened).
    pub uncleanable: Option<String>,
}

/// Saves a replica's epoch history through its shard's `EpochWriter`, each
/// save writing the history as it is when it runs (so the last to finish is
/// the newest). Every record on disk must have its epoch in the saved
/// history, so a leader appends at a new epoch, and a follower appends a
/// batch of a new epoch, only once the save that names it is done
/// (`flushed`); cuts need not wait (an entry past the log end is dropped
/// when the log opens).
#[derive(Debug)]
pub struct EpochSaver {
    writer: Rc<EpochWriter>,
    asked: Cell<u64>,
    pending: RefCell<Option<(u64, PathBuf, EpochHistory)>>,
    /// In the writer's queue (its `pending` not taken yet).
    queued: Cell<bool>,
    /// Set when the replica is removed: its directory is about to go, and
    /// a save landing after that (or in a directory of the same name made
    /// again) would write a history that is not its own.
    closed: Cell<bool>,
    saved: Watermark,
    failures: Cell<u64>,
}

impl EpochSaver {
    pub fn new(writer: Rc<EpochWriter>) -> EpochSaver {
        EpochSaver {
            writer,
            asked: Cell::new(0),
            pending: RefCell::new(None),
            queued: Cell::new(false),
            closed: Cell::new(false),
            saved: Watermark::new(0),
            failures: Cell::new(0),
        }
    }

    /// Asks for `history` to be saved in `dir`.
    pub fn request(self: &Rc<Self>, dir: PathBuf, history: EpochHistory) {
        if self.closed.get() {
            tracing::debug!(dir = %dir.display(), "not saving the epoch history of a removed replica");
            return;
        }
        let n = self.asked.get() + 1;
        self.asked.set(n);
        // A request not taken yet is replaced: only the newest is written.
        *self.pending.borrow_mut() = Some((n, dir, history));
        if !self.queued.replace(true) {
            self.writer.enqueue(self.clone());
        }
    }

    /// Refuses every later request, then waits for those asked before.
    pub async fn close(&self) {
        self.closed.set(true);
        self.flushed().await;
    }

    /// Waits until every save asked for so far is done.
    pub async fn flushed(&self) {
        let asked = self.asked.get() as i64;
        if self.saved.get() < asked {
            self.saved.wait_at_least(asked).await;
        }
    }

    /// Failed saves since the last call.
    pub fn take_failures(&self) -> u64 {
        self.failures.replace(0)
    }
}

/// Writes a shard's epoch histories, one pass at a time on a blocking
/// thread, each pass every history asked for since the last began
/// (`log::write_all_atomically`): a restart that moves the leadership of
/// thousands of partitions saves them in a few passes sharing their syncs,
/// not one file system commit after another per partition. One pass at a
/// time also keeps two saves of one replica from sharing its temp file. The
/// queue holds each replica at most once, so it is bounded by the shard's
/// replicas.
#[derive(Debug, Default)]
pub struct EpochWriter {
    queue: RefCell<Vec<Rc<EpochSaver>>>,
    running: Cell<bool>,
}

impl EpochWriter {
    fn enqueue(self: &Rc<Self>, saver: Rc<EpochSaver>) {
        self.queue.borrow_mut().push(saver);
        if self.running.replace(true) {
            return;
        }
        let writer = self.clone();
        runtime::spawn(async move {
            loop {
                let queued = std::mem::take(&mut *writer.queue.borrow_mut());
                if queued.is_empty() {
                    break;
                }
                let mut savers = Vec::with_capacity(queued.len());
                let mut files = Vec::with_capacity(queued.len());
                for saver in queued {
                    saver.queued.set(false);
                    let (n, dir, history) =
                        saver.pending.borrow_mut().take().expect("a queued save");
                    files.push((dir, history.encode().into_bytes()));
                    savers.push((saver, n));
                }
                let shown: Vec<PathBuf> = files.iter().map(|(dir, _)| dir.clone()).collect();
                let results =
                    runtime::blocking(move || write_all_atomically(EPOCH_FILE, &files)).await;
                for (((saver, n), result), dir) in savers.iter().zip(results).zip(&shown) {
                    if let Err(e) = result {
                        saver.failures.set(saver.failures.get() + 1);
                        tracing::warn!(error = %e, dir = %dir.display(), "saving the leader epoch history failed");
                    }
                    saver.saved.advance(*n as i64);
                }
            }
            writer.running.set(false);
        })
        .detach();
    }
}

impl Replica {
    /// A replica of broker `me` over an opened log, in the role `role` gives
    /// it before its first role change (`Role::opened`).
    pub fn new(
        me: BrokerId,
        topic_id: u64,
        log: Rc<PartitionLog>,
        role: &Role,
        epoch_writer: Rc<EpochWriter>,
    ) -> Replica {
        let log_end = Watermark::new(log.log_end_offset().0);
        // Only the latest epoch is known without a history file: a follower
        // that asks about older ones is cut back further than needed, never
        // too little.
        let fallback = if log.log_end_offset() > log.log_start_offset() {
            EpochHistory::from_entries(vec![(log.latest_epoch(), log.log_start_offset())])
        } else {
            EpochHistory::default()
        };
        let epochs = EpochHistory::load(log.dir(), log.log_end_offset(), fallback);
        Replica {
            topic_id,
            log,
            log_end,
            high_watermark: Watermark::new(0),
            core: RefCell::new(ReplicaCore::new(me, role, epochs)),
            role_version: Watermark::new(0),
            epoch_saver: Rc::new(EpochSaver::new(epoch_writer)),
            cleaning: RefCell::default(),
            maintenance_queued: Cell::new(false),
            maintenance_backoff: RefCell::default(),
        }
    }

    pub fn role(&self) -> Ref<'_, Role> {
        Ref::map(self.core.borrow(), ReplicaCore::role)
    }

    /// Whether this broker still leads the partition at `leader_epoch`.
    pub fn leads_at(&self, leader_epoch: LeaderEpoch) -> bool {
        self.core.borrow().leads_at(leader_epoch)
    }

    /// Saves the epoch history after it changed, off the shard thread.
    pub(super) fn save_epochs(&self) {
        let history = self.core.borrow().epochs().clone();
        self.epoch_saver
            .request(self.log.dir().to_path_buf(), history);
    }

    /// Waits until the epoch history is saved as it is now (see
    /// `EpochSaver`); counts failed saves as storage errors.
    pub(super) async fn epochs_saved(&self, shard: &Shard) {
        self.epoch_saver.flushed().await;
        for _ in 0..self.epoch_saver.take_failures() {
            shard.metrics.on_storage_error();
        }
    }
}

impl Shard {
    /// Moves a replica to the role the metadata gives it
    /// (`ReplicaCore::apply_role`); a follower is fetched for by
    /// `shard::fetcher`.
    pub(super) fn set_role(&self, key: &PartitionKey, replica: &Replica, role: Role) {
        let old = replica.role().clone();
        let end = replica.log.log_end_offset();
        let now_ms = self.monotonic_ms();
        let hw = Offset(replica.high_watermark.get());
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
            replica.save_epochs();
        }
        replica.role_version.advance(replica.role_version.get() + 1);
        self.update_high_watermark(replica);
    }

    /// Opens the log of a replica placed here. `made`: whether
    /// `log::create_empty_logs` just made its directory (then it is an empty
    /// log with its marker, all synced, opened without a rescan), or `None`
    /// if that pass failed part way: then whatever it made may not be
    /// durable, so the directory and its parent are synced, the marker is
    /// written again, and the caller saves the epoch history again.
    pub(super) async fn open_replica(
        &self,
        key: &PartitionKey,
        topic_id: u64,
        log_config: crate::log::LogConfig,
        made: Option<bool>,
    ) -> Result<Rc<PartitionLog>, LogError> {
        let log = self
            .open_replica_log(key, topic_id, log_config, made)
            .await?;
        if let Some(journal) = &self.journal {
            log.attach_journal(journal.clone()).await?;
        }
        if let Some(releaser) = &self.releaser {
            log.release_space_through(releaser.clone());
        }
        Ok(log)
    }

    async fn open_replica_log(
        &self,
        key: &PartitionKey,
        topic_id: u64,
        log_config: crate::log::LogConfig,
        made: Option<bool>,
    ) -> Result<Rc<PartitionLog>, LogError> {
        let dir = partition_dir(&self.config.data_dir, &key.topic, key.partition);
        // Trusted at most once: a later open of the same directory in this
        // run (after a removal, or a new one made here) must not count on
        // the last shutdown.
        let listed = dir.file_name().is_some_and(|name| {
            self.clean_logs
                .borrow_mut()
                .remove(&*name.to_string_lossy())
        });
        if made == Some(true) {
            return PartitionLog::open_empty(&dir, log_config, self.clock.clone()).await;
        }
        if made.is_none() {
            let (parent, owned) = (topics_dir(&self.config.data_dir), dir.clone());
            runtime::blocking(move || {
                sync_dir(&parent)?;
                if owned.exists() {
                    sync_dir(&owned)?;
                }
                Ok::<_, std::io::Error>(())
            })
            .await
            .map_err(|e| LogError::io(&dir, e))?;
        }
        let marker = dir.join(TOPIC_ID_FILE);
        let read = {
            let marker = marker.clone();
            runtime::blocking(move || std::fs::read_to_string(marker)).await
        };
        let mut closed_clean = false;
        match read {
            Ok(text) if text.trim() == topic_id.to_string() => closed_clean = listed,
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
        let log =
            PartitionLog::open_after(&dir, log_config, self.clock.clone(), closed_clean).await?;
        if made.is_none() || !marker.exists() {
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
            // No save may land in the directory after it is gone.
            replica.epoch_saver.close().await;
            if let Err(e) = replica.log.fence_for_removal().await {
                // Kept: a replica made again under this name would otherwise
                // get this one's journaled bytes from a replay.
                tracing::error!(error = %e, dir = %replica.log.dir().display(), "fencing a removed replica's journal records failed; its data is kept");
                return;
            }
            let dir = replica.log.dir().to_path_buf();
            let hold = self.releaser.is_some();
            let removed = runtime::blocking(move || {
                if hold {
                    crate::log::space_release::remove_dir_holding_segments(&dir)
                } else {
                    std::fs::remove_dir_all(&dir).map(|()| Vec::new())
                }
            })
            .await;
            match removed {
                Ok(held) => {
                    if let Some(releaser) = &self.releaser {
                        releaser.release(held);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, dir = %replica.log.dir().display(), "removing a replica's data failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_history_is_saved_and_flushed_waits_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        runtime::run_local(async move {
            let saver = Rc::new(EpochSaver::new(Rc::default()));
            for latest in 1..=5 {
                let entries = (1..=latest)
                    .map(|e| (LeaderEpoch(e), Offset(i64::from(e) * 10)))
                    .collect();
                saver.request(path.clone(), EpochHistory::from_entries(entries));
            }
            saver.flushed().await;
            let saved = EpochHistory::load(&path, Offset(100), EpochHistory::default());
            assert_eq!(
                saved.latest_epoch(),
                Some(LeaderEpoch(5)),
                "the newest history won"
            );
            assert_eq!(saved.entries().len(), 5);
            assert_eq!(saver.take_failures(), 0);
            // Many replicas share one writer: each gets its own history,
            // whether its request came before or during a pass.
            let writer = Rc::new(EpochWriter::default());
            let savers: Vec<(PathBuf, Rc<EpochSaver>)> = (0..40)
                .map(|i| {
                    let dir = path.join(format!("r-{i}"));
                    std::fs::create_dir(&dir).unwrap();
                    (dir, Rc::new(EpochSaver::new(writer.clone())))
                })
                .collect();
            for (i, (dir, saver)) in savers.iter().enumerate() {
                let entries = vec![(LeaderEpoch(i as i32), Offset(0))];
                saver.request(dir.clone(), EpochHistory::from_entries(entries));
            }
            savers[0].1.flushed().await;
            for (i, (dir, saver)) in savers.iter().enumerate() {
                let entries = vec![(LeaderEpoch(i as i32 + 100), Offset(0))];
                saver.request(dir.clone(), EpochHistory::from_entries(entries));
            }
            for (i, (dir, saver)) in savers.iter().enumerate() {
                saver.flushed().await;
                let saved = EpochHistory::load(dir, Offset(0), EpochHistory::default());
                assert_eq!(saved.latest_epoch(), Some(LeaderEpoch(i as i32 + 100)));
                assert_eq!(saver.take_failures(), 0);
            }
            // A failed save is counted, and waiting for it still ends.
            saver.request(path.join("no-such-dir"), EpochHistory::default());
            saver.flushed().await;
            assert_eq!(saver.take_failures(), 1);
            // A removed replica's saver writes nothing more.
            let (dir, saver) = &savers[0];
            saver.close().await;
            saver.request(dir.clone(), EpochHistory::default());
            saver.flushed().await;
            let kept = EpochHistory::load(dir, Offset(0), EpochHistory::default());
            assert_eq!(kept.latest_epoch(), Some(LeaderEpoch(100)));
        });
    }
}
