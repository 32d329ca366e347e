//! `--transaction-ms`: a producer worker's transactions. The worker sends
//! the batches of the open transaction; when it has been open for the
//! configured time the worker seals what it holds, lets those batches be
//! acknowledged (`Draining`), commits in the background (`Ending`), and
//! begins the next with every partition of the topic added (`Adding`).
//! Batches sealed meanwhile belong to the next transaction and wait. The
//! coordinator calls go through the client's `TransactionManager`.

use anyhow::Context as _;
use client::accumulator::ProducerIdentity;
use client::transaction::TransactionManager;
use client::{Cluster, TopicPartition};
use tokio::task::JoinHandle;

/// The coordinator aborts a transaction open longer than this; well above
/// any `--transaction-ms`.
const TRANSACTION_TIMEOUT_MS: u32 = 60_000;

enum Step {
    /// The next transaction's partitions are being added.
    Adding(JoinHandle<client::Result<()>>),
    /// Transaction `current` takes batches.
    Open { started_ns: u64 },
    /// Transaction `current` takes no new batch; its sealed ones are sent.
    Draining,
    /// Transaction `current` is being committed.
    Ending(JoinHandle<client::Result<()>>),
    /// The run's last transaction is committed.
    Done,
}

pub(crate) struct TxnCycle {
    manager: TransactionManager,
    identity: ProducerIdentity,
    partitions: Vec<TopicPartition>,
    length_ns: u64,
    /// Numbers the worker's transactions from 1; 0 before the first.
    current: u64,
    step: Step,
    committed: u64,
}

impl TxnCycle {
    /// Takes the producer id of `transactional_id` (fencing an earlier
    /// instance) and begins adding the first transaction's partitions.
    pub(crate) async fn start(
        cluster: &Cluster,
        transactional_id: &str,
        topic: &str,
        partitions: u32,
        length_ms: u64,
    ) -> anyhow::Result<TxnCycle> {
        let manager =
            TransactionManager::new(cluster.clone(), transactional_id, TRANSACTION_TIMEOUT_MS);
        let identity = manager
            .init()
            .await
            .with_context(|| format!("initialising transactional id {transactional_id}"))?;
        let partitions = (0..partitions as i32)
            .map(|p| TopicPartition::new(topic, p))
            .collect();
        let mut cycle = TxnCycle {
            manager,
            identity,
            partitions,
            length_ns: length_ms * 1_000_000,
            current: 0,
            step: Step::Done,
            committed: 0,
        };
        cycle.begin_next();
        Ok(cycle)
    }

    pub(crate) fn identity(&self) -> ProducerIdentity {
        self.identity
    }

    /// Transactions committed so far.
    pub(crate) fn committed(&self) -> u64 {
        self.committed
    }

    /// The transaction a batch sealed now belongs to.
    pub(crate) fn sealing_into(&self) -> u64 {
        match self.step {
            Step::Open { .. } => self.current,
            _ => self.current + 1,
        }
    }

    /// Batches of this transaction may be sent now; `None`: none may.
    pub(crate) fn sending(&self) -> Option<u64> {
        matches!(self.step, Step::Open { .. } | Step::Draining).then_some(self.current)
    }

    /// Whether the open transaction is due to end: it ran its length, or the
    /// run stopped generating. The caller seals what it holds first.
    pub(crate) fn due(&self, now_ns: u64, generating: bool) -> bool {
        match self.step {
            Step::Open { started_ns } => {
                !generating || now_ns.saturating_sub(started_ns) >= self.length_ns
            }
            _ => false,
        }
    }

    /// Stops the open transaction from taking batches.
    pub(crate) fn drain(&mut self) {
        assert!(matches!(self.step, Step::Open { .. }));
        self.step = Step::Draining;
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self.step, Step::Done)
    }

    /// When the open transaction ends (for the worker's sleep).
    pub(crate) fn ends_at_ns(&self) -> Option<u64> {
        match self.step {
            Step::Open { started_ns } => Some(started_ns + self.length_ns),
            _ => None,
        }
    }

    fn begin_next(&mut self) {
        let (manager, identity, partitions) =
            (self.manager.clone(), self.identity, self.partitions.clone());
        self.step = Step::Adding(tokio::spawn(async move {
            manager.add_partitions(identity, &partitions).await
        }));
    }

    /// Moves on where it can: a draining transaction whose batches are all
    /// acknowledged (`outstanding` false) is committed; a finished commit
    /// begins the next transaction (or ends the cycle once the run has
    /// nothing more to send: `more` false); finished adds open it.
    pub(crate) async fn advance(
        &mut self,
        now_ns: u64,
        outstanding: bool,
        more: bool,
    ) -> anyhow::Result<()> {
        match &mut self.step {
            Step::Draining if !outstanding => {
                let (manager, identity) = (self.manager.clone(), self.identity);
                self.step = Step::Ending(tokio::spawn(
                    async move { manager.end(identity, true).await },
                ));
            }
            Step::Ending(handle) if handle.is_finished() => {
                let current = self.current;
                handle
                    .await
                    .context("commit task")?
                    .with_context(|| format!("committing transaction {current}"))?;
                self.committed += 1;
                if more {
                    self.begin_next();
                } else {
                    self.step = Step::Done;
                }
            }
            Step::Adding(handle) if handle.is_finished() => {
                handle
                    .await
                    .context("add-partitions task")?
                    .context("adding the transaction's partitions")?;
                self.current += 1;
                self.step = Step::Open { started_ns: now_ns };
            }
            _ => {}
        }
        Ok(())
    }
}
