//! The coordinator of the transactional ids that live in one
//! `__transaction_state` partition, as a state machine: requests and timer
//! ticks in; records to write, markers to have written and answers out. It
//! changes its state only by replaying the records it emits (`replay`), the
//! same function that loads a partition, so a coordinator that took over
//! from the log finishes every transaction the old one had prepared
//! (`pending_markers`).
//!
//! A transaction moves Empty or Complete* -> Ongoing (partitions added) ->
//! PrepareCommit or PrepareAbort (the decision, written before any marker)
//! -> CompleteCommit or CompleteAbort (once every partition has its
//! marker). A producer starting with the same transactional id bumps the
//! epoch, which fences the previous instance; an open transaction it left
//! is aborted first (the new instance retries on CONCURRENT_TRANSACTIONS).
//! A transaction open past its timeout is aborted with a bumped epoch too.

use std::collections::BTreeMap;

use protocol::{ErrorCode, ProducerEpoch, ProducerId};
use thiserror::Error;

use super::records::{TxnMetadata, TxnRecord, TxnState};
use super::*;

/// The largest epoch a producer id is started at; the next start takes a
/// new id. `i16::MAX` stays free for the bump that fences and aborts an open
/// transaction, whose markers must carry the same producer id.
pub const PRODUCER_EPOCH_MAX: i16 = i16::MAX - 1;

#[derive(Clone, Debug)]
pub struct TxnCoordinatorConfig {
    /// Ids silent this long without a transaction in flight are forgotten.
    pub id_expiration_ms: i64,
}

impl Default for TxnCoordinatorConfig {
    fn default() -> TxnCoordinatorConfig {
        TxnCoordinatorConfig {
            id_expiration_ms: TXN_ID_EXPIRATION_MS_DEFAULT,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TxnError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("transaction timeout {0} ms is outside {TXN_TIMEOUT_MS_MIN}..={TXN_TIMEOUT_MS_MAX}")]
    InvalidTransactionTimeout(u32),
    #[error("the transaction of {0:?} is being completed; retry")]
    ConcurrentTransactions(String),
    #[error("producer epoch {sent} of {id:?} is fenced by epoch {current}")]
    ProducerFenced { id: String, sent: i16, current: i16 },
    #[error("producer id {sent} is not the one of {id:?}")]
    InvalidProducerIdMapping { id: String, sent: i64 },
    #[error("{0}")]
    InvalidTxnState(String),
    #[error("this coordinator already holds {0} transactional ids")]
    CoordinatorFull(usize),
    #[error("no transactional id {0:?} here")]
    NotFound(String),
}

impl TxnError {
    pub fn code(&self) -> ErrorCode {
        match self {
            TxnError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            TxnError::InvalidTransactionTimeout(_) => ErrorCode::InvalidTransactionTimeout,
            TxnError::ConcurrentTransactions(_) => ErrorCode::ConcurrentTransactions,
            TxnError::ProducerFenced { .. } => ErrorCode::ProducerFenced,
            TxnError::InvalidProducerIdMapping { .. } => ErrorCode::InvalidProducerIdMapping,
            TxnError::InvalidTxnState(_) => ErrorCode::InvalidTxnState,
            TxnError::CoordinatorFull(_) => ErrorCode::CoordinatorNotAvailable,
            TxnError::NotFound(_) => ErrorCode::TransactionalIdNotFound,
        }
    }
}

/// Markers the driver must have every partition leader write (and
/// replicate) before it reports them with `markers_written`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerWork {
    pub transactional_id: String,
    pub producer_id: ProducerId,
    pub producer_epoch: ProducerEpoch,
    pub commit: bool,
    pub partitions: Vec<TopicPartition>,
    /// The transaction's number, carried by its markers.
    pub transaction_number: i64,
}

/// What an event produced: records to write (in order), markers to send
/// once those records are committed, and the answer, sent only once the
/// records are committed.
#[derive(Debug)]
pub struct Written<T> {
    pub records: Vec<TxnRecord>,
    pub markers: Vec<MarkerWork>,
    pub response: Result<T, TxnError>,
}

impl<T> Written<T> {
    fn refused(error: TxnError) -> Written<T> {
        Written {
            records: Vec::new(),
            markers: Vec::new(),
            response: Err(error),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnCoordinator {
    config_id_expiration_ms: i64,
    ids: BTreeMap<String, TxnMetadata>,
}

impl TxnCoordinator {
    pub fn new(config: TxnCoordinatorConfig) -> TxnCoordinator {
        TxnCoordinator {
            config_id_expiration_ms: config.id_expiration_ms,
            ids: BTreeMap::new(),
        }
    }

    /// Applies a record, written by this coordinator or read at load.
    pub fn replay(&mut self, record: &TxnRecord) {
        match &record.value {
            Some(m) => {
                self.ids.insert(record.transactional_id.clone(), m.clone());
            }
            None => {
                self.ids.remove(&record.transactional_id);
            }
        }
    }

    pub fn get(&self, transactional_id: &str) -> Option<&TxnMetadata> {
        self.ids.get(transactional_id)
    }

    /// Every transactional id and its metadata, by id.
    pub fn list(&self) -> impl Iterator<Item = (&String, &TxnMetadata)> {
        self.ids.iter()
    }

    /// Markers owed by prepared transactions: after a load, the new
    /// coordinator sends them again (a partition that took the
    /// transaction's marker already knows it by its number and writes
    /// nothing).
    pub fn pending_markers(&self) -> Vec<MarkerWork> {
        self.ids
            .iter()
            .filter(|(_, m)| m.state.is_prepared())
            .map(|(id, m)| marker_work(id, m))
            .collect()
    }

    fn write<T>(&mut self, id: &str, value: Option<TxnMetadata>, response: T) -> Written<T> {
        let record = TxnRecord {
            transactional_id: id.to_owned(),
            value,
        };
        self.replay(&record);
        let markers = match self.ids.get(id) {
            Some(m) if m.state.is_prepared() => vec![marker_work(id, m)],
            _ => Vec::new(),
        };
        Written {
            records: vec![record],
            markers,
            response: Ok(response),
        }
    }

    /// A producer starts with `transactional_id`: a new id gets `fresh`
    /// at epoch 0; a known one gets its epoch bumped (fencing the previous
    /// instance), or `fresh` at epoch 0 once the epoch is exhausted. An
    /// open transaction is aborted first and the caller retries.
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        timeout_ms: u32,
        fresh: ProducerId,
        now_ms: i64,
    ) -> Written<(ProducerId, ProducerEpoch)> {
        if transactional_id.is_empty() || transactional_id.len() > TRANSACTIONAL_ID_BYTES_MAX {
            return Written::refused(TxnError::InvalidRequest(format!(
                "a transactional id has 1..={TRANSACTIONAL_ID_BYTES_MAX} bytes"
            )));
        }
        if !(TXN_TIMEOUT_MS_MIN..=TXN_TIMEOUT_MS_MAX).contains(&timeout_ms) {
            return Written::refused(TxnError::InvalidTransactionTimeout(timeout_ms));
        }
        let Some(current) = self.ids.get(transactional_id).cloned() else {
            if self.ids.len() >= TXN_IDS_PER_COORDINATOR_MAX {
                return Written::refused(TxnError::CoordinatorFull(self.ids.len()));
            }
            let m = TxnMetadata {
                producer_id: fresh,
                producer_epoch: ProducerEpoch(0),
                timeout_ms,
                state: TxnState::Empty,
                start_ms: -1,
                update_ms: now_ms,
                partitions: Vec::new(),
                transaction_number: 0,
            };
            return self.write(transactional_id, Some(m), (fresh, ProducerEpoch(0)));
        };
        match current.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => Written::refused(
                TxnError::ConcurrentTransactions(transactional_id.to_owned()),
            ),
            TxnState::Ongoing => {
                // The previous instance left a transaction open: abort it
                // under a bumped epoch, so its late writes are refused.
                let aborted = self.abort_fenced(transactional_id, current, now_ms);
                Written {
                    records: aborted.records,
                    markers: aborted.markers,
                    response: Err(TxnError::ConcurrentTransactions(
                        transactional_id.to_owned(),
                    )),
                }
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let (producer_id, producer_epoch) = bumped(&current, fresh);
                let m = TxnMetadata {
                    producer_id,
                    producer_epoch,
                    timeout_ms,
                    state: TxnState::Empty,
                    start_ms: -1,
                    update_ms: now_ms,
                    partitions: Vec::new(),
                    ..current
                };
                self.write(transactional_id, Some(m), (producer_id, producer_epoch))
            }
        }
    }

    /// PrepareAbort under a bumped epoch of the same producer id (a new
    /// producer took over, or the transaction timed out): the partitions
    /// know the transaction by that id.
    fn abort_fenced(&mut self, id: &str, current: TxnMetadata, now_ms: i64) -> Written<()> {
        assert!(
            current.producer_epoch.0 < i16::MAX,
            "an open transaction's epoch leaves room for the fencing bump"
        );
        let m = TxnMetadata {
            producer_epoch: ProducerEpoch(current.producer_epoch.0 + 1),
            state: TxnState::PrepareAbort,
            update_ms: now_ms,
            ..current
        };
        self.write(id, Some(m), ())
    }

    /// The caller's producer id and epoch must be the transactional id's.
    fn check_producer(
        &self,
        id: &str,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
    ) -> Result<&TxnMetadata, TxnError> {
        let m = self
            .ids
            .get(id)
            .ok_or_else(|| TxnError::InvalidProducerIdMapping {
                id: id.to_owned(),
                sent: producer_id.0,
            })?;
        if m.producer_id != producer_id {
            return Err(TxnError::InvalidProducerIdMapping {
                id: id.to_owned(),
                sent: producer_id.0,
            });
        }
        if m.producer_epoch != producer_epoch {
            return Err(TxnError::ProducerFenced {
                id: id.to_owned(),
                sent: producer_epoch.0,
                current: m.producer_epoch.0,
            });
        }
        Ok(m)
    }

    /// Adds partitions to the producer's transaction, beginning one if none
    /// is open.
    pub fn add_partitions(
        &mut self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        partitions: &[TopicPartition],
        now_ms: i64,
    ) -> Written<()> {
        let current = match self.check_producer(transactional_id, producer_id, producer_epoch) {
            Ok(m) => m.clone(),
            Err(e) => return Written::refused(e),
        };
        if partitions.is_empty() {
            return Written::refused(TxnError::InvalidRequest("no partitions".into()));
        }
        if current.state.is_prepared() {
            return Written::refused(TxnError::ConcurrentTransactions(
                transactional_id.to_owned(),
            ));
        }
        let open = current.state == TxnState::Ongoing;
        let mut all = if open {
            current.partitions.clone()
        } else {
            Vec::new()
        };
        all.extend(partitions.iter().cloned());
        all.sort();
        all.dedup();
        if all.len() > TXN_PARTITIONS_MAX {
            return Written::refused(TxnError::InvalidRequest(format!(
                "a transaction spans at most {TXN_PARTITIONS_MAX} partitions"
            )));
        }
        if open && all == current.partitions {
            return Written {
                records: Vec::new(),
                markers: Vec::new(),
                response: Ok(()),
            };
        }
        let m = TxnMetadata {
            state: TxnState::Ongoing,
            start_ms: if open { current.start_ms } else { now_ms },
            update_ms: now_ms,
            partitions: all,
            transaction_number: if open {
                current.transaction_number
            } else {
                current.transaction_number + 1
            },
            ..current
        };
        self.write(transactional_id, Some(m), ())
    }

    /// The producer commits or aborts its transaction: the decision is
    /// written, then the markers are owed. A retry after completion of the
    /// same decision succeeds again.
    pub fn end_txn(
        &mut self,
        transactional_id: &str,
        producer_id: ProducerId,
        producer_epoch: ProducerEpoch,
        commit: bool,
        now_ms: i64,
    ) -> Written<()> {
        let current = match self.check_producer(transactional_id, producer_id, producer_epoch) {
            Ok(m) => m.clone(),
            Err(e) => return Written::refused(e),
        };
        let mismatch = |state: TxnState| {
            TxnError::InvalidTxnState(format!(
                "cannot {} a transaction in state {}",
                if commit { "commit" } else { "abort" },
                state.name()
            ))
        };
        match (current.state, commit) {
            (TxnState::Ongoing, _) => {
                let m = TxnMetadata {
                    state: if commit {
                        TxnState::PrepareCommit
                    } else {
                        TxnState::PrepareAbort
                    },
                    update_ms: now_ms,
                    ..current
                };
                self.write(transactional_id, Some(m), ())
            }
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => Written::refused(
                TxnError::ConcurrentTransactions(transactional_id.to_owned()),
            ),
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Written {
                records: Vec::new(),
                markers: Vec::new(),
                response: Ok(()),
            },
            (state, _) => Written::refused(mismatch(state)),
        }
    }

    /// Every marker of the prepared transaction at this producer epoch is
    /// written: the transaction completes. Anything else (a late report for
    /// an older epoch or state) changes nothing.
    pub fn markers_written(&mut self, work: &MarkerWork, now_ms: i64) -> Vec<TxnRecord> {
        let Some(current) = self.ids.get(&work.transactional_id).cloned() else {
            return Vec::new();
        };
        let expected = if work.commit {
            TxnState::PrepareCommit
        } else {
            TxnState::PrepareAbort
        };
        if current.state != expected
            || current.producer_id != work.producer_id
            || current.producer_epoch != work.producer_epoch
            || current.transaction_number != work.transaction_number
        {
            return Vec::new();
        }
        let m = TxnMetadata {
            state: if work.commit {
                TxnState::CompleteCommit
            } else {
                TxnState::CompleteAbort
            },
            start_ms: -1,
            update_ms: now_ms,
            partitions: Vec::new(),
            ..current
        };
        self.write(&work.transactional_id, Some(m), ()).records
    }

    /// Timers: transactions open past their timeout are aborted under a
    /// bumped epoch; ids idle past the expiration are forgotten.
    pub fn tick(&mut self, now_ms: i64) -> Written<()> {
        let mut out = Written {
            records: Vec::new(),
            markers: Vec::new(),
            response: Ok(()),
        };
        let ids: Vec<(String, TxnMetadata)> = self
            .ids
            .iter()
            .map(|(id, m)| (id.clone(), m.clone()))
            .collect();
        for (id, m) in ids {
            let timed_out = m.state == TxnState::Ongoing
                && now_ms.saturating_sub(m.start_ms) > i64::from(m.timeout_ms);
            let idle = !m.state.is_prepared()
                && m.state != TxnState::Ongoing
                && now_ms.saturating_sub(m.update_ms) > self.config_id_expiration_ms;
            let written = if timed_out {
                self.abort_fenced(&id, m, now_ms)
            } else if idle {
                self.write(&id, None, ())
            } else {
                continue;
            };
            out.records.extend(written.records);
            out.markers.extend(written.markers);
        }
        out
    }

    /// Whether both hold the same transactional ids with the same metadata
    /// (settings aside).
    pub fn same_state(&self, other: &TxnCoordinator) -> bool {
        self.ids == other.ids
    }

    /// Invariants of every id's metadata.
    pub fn check_invariants(&self) {
        for id in self.ids.keys() {
            self.check_id(id);
        }
        assert!(self.ids.len() <= TXN_IDS_PER_COORDINATOR_MAX);
    }

    /// Invariants of one id's metadata (checked after each change: the
    /// whole table may hold many ids).
    pub fn check_id(&self, id: &str) {
        let Some(m) = self.ids.get(id) else { return };
        assert!(
            m.partitions.windows(2).all(|w| w[0] < w[1]),
            "{id}: partitions sorted and distinct"
        );
        match m.state {
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort => assert!(
                !m.partitions.is_empty() && m.start_ms >= 0,
                "{id}: an open or prepared transaction has partitions and a start"
            ),
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => assert!(
                m.partitions.is_empty(),
                "{id}: no partitions outside a transaction"
            ),
        }
        assert!(m.producer_epoch.0 >= 0);
        assert!(
            m.producer_epoch.0 <= PRODUCER_EPOCH_MAX || m.state != TxnState::Ongoing,
            "{id}: an open transaction leaves room for the fencing bump"
        );
        assert!(self.ids.len() <= TXN_IDS_PER_COORDINATOR_MAX);
    }
}

/// The epoch after `m`'s, or `fresh` at 0 once `m`'s id is used up.
fn bumped(m: &TxnMetadata, fresh: ProducerId) -> (ProducerId, ProducerEpoch) {
    if m.producer_epoch.0 >= PRODUCER_EPOCH_MAX {
        (fresh, ProducerEpoch(0))
    } else {
        (m.producer_id, ProducerEpoch(m.producer_epoch.0 + 1))
    }
}

fn marker_work(id: &str, m: &TxnMetadata) -> MarkerWork {
    MarkerWork {
        transactional_id: id.to_owned(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        commit: m.state == TxnState::PrepareCommit,
        partitions: m.partitions.clone(),
        transaction_number: m.transaction_number,
    }
}
