//! The follower side of a replica: which leader endpoints this shard fetches
//! from, and applying a leader's answer as `replication::follower::decide`
//! says (cut a diverged suffix, restart at the leader's log start, append).

use std::rc::Rc;

use protocol::replica_fetch::FetchedPartition;
use protocol::{ErrorCode, LeaderEpoch, Offset};

use super::{fetcher, OpError, Replica, Shard};
use crate::partition::PartitionKey;
use crate::runtime::{self, TaskClass};

impl Shard {
    /// Starts a follower fetcher for every leader endpoint some follower
    /// replica here needs and none runs for yet.
    pub(super) fn ensure_fetchers(self: &Rc<Self>) {
        let endpoints: std::collections::BTreeSet<String> = self
            .replicas
            .borrow()
            .values()
            .filter_map(|r| {
                let role = r.role();
                (!role.leader)
                    .then(|| role.leader_endpoint.clone())
                    .flatten()
            })
            .collect();
        for endpoint in endpoints {
            if self.fetchers.borrow_mut().insert(endpoint.clone()) {
                tracing::info!(shard = self.id, leader = %endpoint, "starting follower fetcher");
                runtime::spawn_in(TaskClass::Replication, fetcher::run(self.clone(), endpoint))
                    .detach();
            }
        }
    }

    /// Follower replicas fetching from `endpoint`: (key, replica, leader epoch).
    pub fn followers_of(&self, endpoint: &str) -> Vec<(PartitionKey, Rc<Replica>, LeaderEpoch)> {
        self.replicas
            .borrow()
            .iter()
            .filter_map(|(k, r)| {
                let role = r.role();
                (!role.leader && role.leader_endpoint.as_deref() == Some(endpoint))
                    .then(|| (k.clone(), r.clone(), role.leader_epoch))
            })
            .collect()
    }

    /// A follower applies its leader's answer for one partition as
    /// `replication::follower::decide` says: cut a diverged suffix, restart at
    /// the leader's log start, or append the records and take the high
    /// watermark. Stops wherever the replica stopped following at
    /// `leader_epoch` while it awaited; an error means "back off".
    pub async fn apply_fetched(
        &self,
        key: &PartitionKey,
        replica: &Rc<Replica>,
        leader_epoch: LeaderEpoch,
        fetched: FetchedPartition,
    ) -> Result<(), OpError> {
        use crate::replication::follower::{FollowerAction, LeaderAnswer};
        let still_following = || replica.core.borrow().follows_at(leader_epoch);
        // The log's cuts run to their end as tasks of their own, so they
        // check through a handle of their own.
        let still_following_owned: Rc<dyn Fn() -> bool> = {
            let replica = replica.clone();
            Rc::new(move || replica.core.borrow().follows_at(leader_epoch))
        };
        if !still_following() {
            return Ok(());
        }
        let answer = LeaderAnswer::from_wire(&fetched);
        let own_end = replica.log.log_end_offset();
        let action = replica.core.borrow().follower_action(&answer, own_end);
        match action {
            FollowerAction::Retry => Err(OpError::new(
                fetched.error,
                format!("leader refused the fetch at {own_end}"),
            )),
            FollowerAction::Truncate(cut) => {
                tracing::warn!(topic = %key.topic, partition = key.partition, from = %own_end, to = %cut, %leader_epoch, "truncating a diverged follower log");
                let cut_done = replica
                    .log
                    .truncate_to_if(cut, still_following_owned)
                    .await
                    .map_err(|e| self.log_error(e))?;
                if let Some(new_end) = cut_done {
                    self.after_cut(key, replica, new_end);
                }
                Ok(())
            }
            FollowerAction::RestartAt(start) => {
                tracing::warn!(topic = %key.topic, partition = key.partition, own_end = %own_end, leader_log_start = %start, "the leader's log starts past this replica's end; starting over there");
                let done = replica
                    .log
                    .reset_to_if(start, still_following_owned)
                    .await
                    .map_err(|e| self.log_error(e))?;
                if done {
                    self.after_cut(key, replica, start);
                    // Everything below the leader's log start is committed.
                    replica.high_watermark.set(start.0);
                }
                Ok(())
            }
            FollowerAction::Append => {
                let end_before = replica.log.log_end_offset();
                let appended = self
                    .append_fetched(replica, &fetched.records, &still_following)
                    .await;
                // Only a log that grew has work (most partitions of a fetch
                // answer come back empty); even a failed fetch may have
                // appended some batches first.
                if replica.log.log_end_offset() != end_before {
                    self.queue_maintenance(key, replica);
                }
                appended?;
                if still_following() {
                    let hw = crate::replication::follower::follower_high_watermark(
                        answer.high_watermark,
                        replica.log.log_end_offset(),
                    );
                    replica.high_watermark.set(hw.0);
                }
                Ok(())
            }
        }
    }

    /// After a follower's log was cut (or restarted) so it ends at `new_end`:
    /// the epoch history, cached batches and watermarks follow the log.
    pub(super) fn after_cut(&self, key: &PartitionKey, replica: &Replica, new_end: Offset) {
        self.cache.borrow_mut().remove_partition(key);
        if replica.core.borrow_mut().cut(new_end) {
            replica.save_epochs();
        }
        replica.log_end.set(new_end.0);
        if replica.high_watermark.get() > new_end.0 {
            replica.high_watermark.reset(new_end.0);
        }
    }

    /// Appends the batches a leader sent, each validated by the log.
    pub(super) async fn append_fetched(
        &self,
        replica: &Replica,
        records: &[u8],
        still_following: &dyn Fn() -> bool,
    ) -> Result<(), OpError> {
        let mut rest = records;
        while !rest.is_empty() {
            if !still_following() {
                return Ok(());
            }
            // Only the header here, to find the batch's end; the log's append
            // validates the whole batch (CRC included) once.
            let corrupt = |why: String| OpError::new(ErrorCode::CorruptMessage, why);
            let header = protocol::BatchHeader::parse(rest).map_err(|e| corrupt(e.to_string()))?;
            let used = header.total_bytes();
            if used > rest.len() {
                return Err(corrupt(format!(
                    "batch of {used} bytes, {} left in the response",
                    rest.len()
                )));
            }
            let bytes = &rest[..used];
            rest = &rest[used..];
            let log_end = replica.log.log_end_offset();
            if header.next_offset() <= log_end {
                continue;
            }
            // A batch of a new epoch lands only once the saved history names
            // that epoch (`EpochSaver`).
            if header.base_offset == log_end {
                self.note_epoch(replica, header.partition_leader_epoch, log_end);
            }
            replica.epochs_saved(self).await;
            if !still_following() {
                return Ok(());
            }
            let info = match replica.log.append_replica(bytes).await {
                Ok(info) => info,
                Err(e) => {
                    // The epoch noted for a batch that did not land goes too.
                    let end = replica.log.log_end_offset();
                    if replica.core.borrow_mut().cut(end) {
                        replica.save_epochs();
                    }
                    return Err(self.log_error(e));
                }
            };
            replica.log_end.advance(info.log_end_offset.0);
        }
        Ok(())
    }
}
