//! Fetch on the leader, for consumers (below the high watermark) and for
//! followers (to the log end, after `replication::leader` checked the
//! follower's epoch and divergence); offset lookups and partition detail.

use std::time::Duration;

use protocol::{ErrorCode, Offset};

use super::{
    FetchOutcome, FetchReader, Isolation, OpError, PartitionDetail, Replica, ReplicaFetch, Shard,
    UNKNOWN_OFFSET,
};
use crate::partition::{Chunks, PartitionKey};
use crate::runtime::{self, Watermark};

impl Shard {
    pub(super) async fn fetch_local(
        &self,
        key: &PartitionKey,
        offset: Offset,
        max_bytes: usize,
        wait_ms: u64,
        reader: FetchReader,
        cancel: Option<&Watermark>,
    ) -> FetchOutcome {
        let (follower, isolation) = match reader {
            FetchReader::Follower(f) => (Some(f), Isolation::ReadUncommitted),
            FetchReader::Consumer(isolation) => (None, isolation),
        };
        let failed = |e: OpError| FetchOutcome {
            error: Some(e),
            high_watermark: UNKNOWN_OFFSET,
            log_start_offset: UNKNOWN_OFFSET,
            log_end_offset: UNKNOWN_OFFSET,
            last_stable_offset: UNKNOWN_OFFSET,
            ..FetchOutcome::default()
        };
        let replica = match self.leader_replica(key) {
            Ok((replica, _)) => replica,
            Err(e) => return failed(e),
        };
        if let Some(f) = follower {
            if let Some(refused) = self.accept_follower_fetch(&replica, &f, offset) {
                return refused;
            }
        }
        let deadline = self.clock.monotonic()
            + Duration::from_millis(wait_ms.min(self.config.fetch_wait_ms_max));
        loop {
            let (start, end) = (replica.log.log_start_offset(), replica.log.log_end_offset());
            let hw = Offset(replica.high_watermark.get()).min(end);
            let lso = replica.log.last_stable_offset(hw);
            // Consumers read committed records only (read_committed: only
            // stable ones); followers read all. A wait ends when the mark
            // moves past where it stands now.
            let (limit, watermark, waiting_from) = match (follower, isolation) {
                (Some(_), _) => (end, &replica.log_end, offset),
                (None, Isolation::ReadUncommitted) => (hw, &replica.high_watermark, offset),
                (None, Isolation::ReadCommitted) => (lso, &replica.high_watermark, offset.max(hw)),
            };
            let mut outcome = FetchOutcome {
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: start,
                log_end_offset: end,
                ..FetchOutcome::default()
            };
            if offset < start || offset > end {
                outcome.error = Some(OpError::new(
                    ErrorCode::OffsetOutOfRange,
                    format!("offset {offset} outside [{start}, {end}]"),
                ));
                return outcome;
            }
            // The records, and the offset after the last returned batch;
            // none when the request has no room left (`max_bytes` 0: the
            // partition's state only, without waiting).
            if max_bytes == 0 {
                return outcome;
            }
            let (records, records_end) = if offset >= limit {
                (Chunks::default(), offset)
            } else {
                let cached = self.cache.borrow().read(key, offset, max_bytes, limit);
                match cached {
                    Some(found) => found,
                    None => match replica.log.read(offset, max_bytes, limit).await {
                        Ok(fetched) => (Chunks::from(fetched.bytes), fetched.next_offset),
                        Err(e) => {
                            outcome.error = Some(self.log_error(e));
                            return outcome;
                        }
                    },
                }
            };
            let now = self.clock.monotonic();
            let cancelled = cancel.is_some_and(|c| c.get() > 0);
            if !records.is_empty() || now >= deadline || cancelled {
                // Only the aborts the returned batches need: a reader far
                // behind would otherwise get every abort up to the LSO.
                if follower.is_none() && isolation == Isolation::ReadCommitted {
                    outcome.aborted = replica.log.aborted_transactions(offset, records_end);
                }
                outcome.records = records;
                return outcome;
            }
            let _waiting = self.metrics.fetch_waiter();
            let woken = watermark.wait_at_least(waiting_from.0 + 1);
            match cancel {
                Some(cancel) => {
                    runtime::timeout(
                        deadline - now,
                        futures_lite::future::or(woken, cancel.wait_at_least(1)),
                    )
                    .await
                }
                None => runtime::timeout(deadline - now, woken).await,
            };
            if !replica.role().leader {
                return failed(OpError::new(
                    ErrorCode::NotLeaderOrFollower,
                    format!("no longer the leader of {}-{}", key.topic, key.partition),
                ));
            }
        }
    }

    /// A leader's checks of a follower's fetch at `offset`, by
    /// `ReplicaCore::follower_fetch`: the leadership, the follower's
    /// incarnation, where its log diverges. Records the follower's progress
    /// and moves the high watermark when the fetch is accepted; else returns
    /// the answer to send.
    pub(super) fn accept_follower_fetch(
        &self,
        replica: &Replica,
        f: &ReplicaFetch,
        offset: Offset,
    ) -> Option<FetchOutcome> {
        use crate::replication::replica::FollowerFetchVerdict;
        let end = replica.log.log_end_offset();
        let registered = self
            .view
            .borrow()
            .brokers
            .get(&f.broker_id)
            .map(|b| b.epoch);
        let now_ms = self.monotonic_ms();
        let verdict = replica
            .core
            .borrow_mut()
            .follower_fetch(f, offset, end, registered, now_ms);
        match verdict {
            FollowerFetchVerdict::Serve => {
                self.update_high_watermark(replica);
                None
            }
            FollowerFetchVerdict::Refuse(code, message) => Some(FetchOutcome {
                error: Some(OpError::new(code, message)),
                high_watermark: UNKNOWN_OFFSET,
                log_start_offset: UNKNOWN_OFFSET,
                log_end_offset: UNKNOWN_OFFSET,
                last_stable_offset: UNKNOWN_OFFSET,
                ..FetchOutcome::default()
            }),
            FollowerFetchVerdict::Diverging { epoch, end_offset } => Some(FetchOutcome {
                high_watermark: Offset(replica.high_watermark.get()),
                log_start_offset: replica.log.log_start_offset(),
                log_end_offset: end,
                diverging: Some((epoch, end_offset)),
                ..FetchOutcome::default()
            }),
        }
    }

    pub(super) async fn list_offset_local(
        &self,
        key: &PartitionKey,
        timestamp_ms: i64,
        isolation: Isolation,
    ) -> Result<Offset, OpError> {
        let (replica, _) = self.leader_replica(key)?;
        let hw = Offset(replica.high_watermark.get()).min(replica.log.log_end_offset());
        // The log start needs no settled high watermark; the latest offset
        // and a timestamp's offset do.
        if timestamp_ms != -2 && !replica.core.borrow().high_watermark_established(hw) {
            return Err(OpError::new(
                ErrorCode::OffsetNotAvailable,
                format!(
                    "{}-{}: the new leader's high watermark {hw} has not reached its epoch's start yet",
                    key.topic, key.partition
                ),
            ));
        }
        match timestamp_ms {
            -2 => Ok(replica.log.log_start_offset()),
            // The latest offset a consumer can read up to.
            -1 => Ok(match isolation {
                Isolation::ReadUncommitted => hw,
                Isolation::ReadCommitted => replica.log.last_stable_offset(hw),
            }),
            ts if ts < 0 => Err(OpError::new(
                ErrorCode::InvalidRequest,
                format!("timestamp {ts} is not -2, -1 or a time"),
            )),
            ts => Ok(replica
                .log
                .offset_for_timestamp(ts)
                .await
                .map_err(|e| self.log_error(e))?
                .unwrap_or(UNKNOWN_OFFSET)),
        }
    }

    pub(super) fn describe_local(&self, key: &PartitionKey) -> PartitionDetail {
        match self.replica(key) {
            Err(e) => PartitionDetail {
                error: Some(e),
                ..PartitionDetail::default()
            },
            Ok(r) => PartitionDetail {
                error: None,
                log_start_offset: r.log.log_start_offset(),
                log_end_offset: r.log.log_end_offset(),
                high_watermark: Offset(r.high_watermark.get()).min(r.log.log_end_offset()),
                size_bytes: r.log.size_bytes(),
            },
        }
    }
}
