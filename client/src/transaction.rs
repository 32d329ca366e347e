//! A transactional producer's side of the transaction protocol: where the
//! producer stands (`TxnPhase`), which partitions the open transaction has
//! written (added to it at the coordinator before their first batch is
//! sent), and the coordinator calls (InitProducerId, AddPartitionsToTxn,
//! EndTxn), each retried while the coordinator moves or is still finishing
//! the previous transaction (CONCURRENT_TRANSACTIONS).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use protocol::{ApiKey, ErrorCode};

use crate::accumulator::{ProducerIdentity, TopicPartition};
use crate::cluster::Cluster;
use crate::coordinator::{Coordinator, RetryPolicy};
use crate::error::{ClientError, Result};
use crate::messages::{self, ConsumerGroupMetadata};

/// Pause between retries of a call the coordinator answered with a
/// retriable error, mostly CONCURRENT_TRANSACTIONS (the previous
/// transaction's markers are still being written, usually for a few ms),
/// doubled up to `CONCURRENT_RETRY_MS_MAX`.
const CONCURRENT_RETRY_MS: u64 = 2;
const CONCURRENT_RETRY_MS_MAX: u64 = 50;

/// Where a transactional producer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnPhase {
    /// `init_transactions` has not succeeded yet.
    Uninitialized,
    /// Between transactions.
    Ready,
    /// `begin_transaction` was called: records may be sent.
    InTransaction,
    /// `commit_transaction` or `abort_transaction` runs: records enqueued
    /// before it are delivered, later ones refused.
    Ending,
    /// Another instance took the transactional id over, or the id's
    /// producer was refused for good: the producer must be closed.
    Fenced(String),
}

/// What the producer handle and its background task share.
#[derive(Debug)]
pub struct TxnShared {
    pub phase: TxnPhase,
    /// Partitions the open transaction was extended to at the coordinator.
    pub added: BTreeSet<TopicPartition>,
    /// Why the open transaction cannot commit (a batch failed for good, or
    /// a partition could not be added): it must be aborted.
    pub failure: Option<ClientError>,
    /// The identity the coordinator gave last.
    pub identity: Option<ProducerIdentity>,
    /// A group's offsets were committed in the open transaction.
    pub offsets_added: bool,
}

/// One transactional id's coordinator calls and shared state.
#[derive(Clone, Debug)]
pub struct TransactionManager {
    cluster: Cluster,
    coordinator: Coordinator,
    transactional_id: String,
    timeout_ms: u32,
    wait_ms_max: u64,
    shared: Arc<Mutex<TxnShared>>,
}

impl TransactionManager {
    pub fn new(cluster: Cluster, transactional_id: &str, timeout_ms: u32) -> TransactionManager {
        let policy = RetryPolicy::default();
        TransactionManager {
            coordinator: Coordinator::for_transaction(cluster.clone(), transactional_id, policy),
            cluster,
            transactional_id: transactional_id.to_owned(),
            timeout_ms,
            wait_ms_max: policy.wait_ms_max,
            shared: Arc::new(Mutex::new(TxnShared {
                phase: TxnPhase::Uninitialized,
                added: BTreeSet::new(),
                failure: None,
                identity: None,
                offsets_added: false,
            })),
        }
    }

    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    pub fn shared(&self) -> MutexGuard<'_, TxnShared> {
        self.shared.lock().expect("transaction state lock")
    }

    /// Sends one request to the coordinator, again while it answers
    /// CONCURRENT_TRANSACTIONS, within the retry policy's wait.
    async fn call<T>(
        &self,
        api: ApiKey,
        body: &[u8],
        decode: impl Fn(&[u8]) -> Result<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + Duration::from_millis(self.wait_ms_max);
        let mut pause_ms = CONCURRENT_RETRY_MS;
        loop {
            match self.coordinator.call(api, body, &decode).await {
                // CONCURRENT_TRANSACTIONS, and writes of the coordinator
                // that timed out waiting for replication: the same call
                // again finds out where the transaction stands.
                Err(error)
                    if error.is_retriable()
                        && Instant::now() + Duration::from_millis(pause_ms) < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                    pause_ms = (pause_ms * 2).min(CONCURRENT_RETRY_MS_MAX);
                }
                other => return other,
            }
        }
    }

    /// The id's producer id and a new epoch (fencing earlier instances).
    pub async fn init(&self) -> Result<ProducerIdentity> {
        let body = messages::init_producer_id_request(Some((
            self.transactional_id.as_str(),
            self.timeout_ms,
        )));
        let (id, epoch) = self
            .call(
                ApiKey::InitProducerId,
                &body,
                messages::init_producer_id_response,
            )
            .await?;
        Ok(ProducerIdentity { id, epoch })
    }

    pub async fn add_partitions(
        &self,
        identity: ProducerIdentity,
        partitions: &[TopicPartition],
    ) -> Result<()> {
        let body = messages::add_partitions_to_txn_request(
            &self.transactional_id,
            (identity.id, identity.epoch),
            partitions,
        );
        self.call(
            ApiKey::AddPartitionsToTxn,
            &body,
            messages::add_partitions_to_txn_response,
        )
        .await
    }

    /// Commits `group`'s `offsets` in the open transaction: the group's
    /// offsets partition joins the transaction (AddOffsetsToTxn), then the
    /// group's coordinator holds the offsets until the marker
    /// (TxnOffsetCommit).
    pub async fn commit_offsets(
        &self,
        identity: ProducerIdentity,
        group: &ConsumerGroupMetadata,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<()> {
        let body = messages::add_offsets_to_txn_request(
            &self.transactional_id,
            (identity.id, identity.epoch),
            &group.group_id,
        );
        self.call(
            ApiKey::AddOffsetsToTxn,
            &body,
            messages::add_offsets_to_txn_response,
        )
        .await?;
        let body = messages::txn_offset_commit_request(
            &self.transactional_id,
            (identity.id, identity.epoch),
            group,
            offsets,
        );
        Coordinator::new(
            self.cluster.clone(),
            &group.group_id,
            RetryPolicy::default(),
        )
        .call(
            ApiKey::TxnOffsetCommit,
            &body,
            messages::txn_offset_commit_response,
        )
        .await
    }

    pub async fn end(&self, identity: ProducerIdentity, commit: bool) -> Result<()> {
        let body = messages::end_txn_request(
            &self.transactional_id,
            (identity.id, identity.epoch),
            commit,
        );
        self.call(ApiKey::EndTxn, &body, messages::end_txn_response)
            .await
    }
}

/// Whether an error means another instance owns the transactional id now.
pub fn is_fencing(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Broker {
            code: ErrorCode::ProducerFenced
                | ErrorCode::InvalidProducerEpoch
                | ErrorCode::InvalidProducerIdMapping
                | ErrorCode::TransactionCoordinatorFenced,
            ..
        }
    )
}
