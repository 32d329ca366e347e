//! Typed configuration of the client: connection, producer, consumer and
//! consumer group settings, each field with its unit, default and bound, validated once when
//! the component is built. Never read from the environment here.

use std::time::Duration;

use protocol::frame::{CLIENT_ID_BYTES_MAX, FRAME_SIZE_BYTES_MAX_DEFAULT};
use protocol::Compression;

use crate::error::{ClientError, Result};
use crate::group_types::GROUP_ID_BYTES_MAX;

fn invalid(field: &'static str, reason: impl Into<String>) -> ClientError {
    ClientError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

fn check_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<()> {
    if value < min || value > max {
        return Err(invalid(field, format!("{value} is outside [{min}, {max}]")));
    }
    Ok(())
}

/// Settings shared by every connection a client opens.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Sent in every request header. Default `ringlog`; at most 256 bytes.
    pub client_id: String,
    /// Bound on requests sent and not yet answered on one connection; a
    /// sender waits for a slot. Default 64; 1..=1024.
    pub in_flight_requests_max: usize,
    /// How long a request may wait for its response. Default 30 000 ms;
    /// 1..=3 600 000.
    pub request_timeout_ms: u64,
    /// How long a TCP connect may take. Default 10 000 ms; 1..=600 000.
    pub connect_timeout_ms: u64,
    /// Bound on one response frame, checked before allocating it. Default
    /// 64 MiB (the protocol default); 1 KiB..=1 GiB.
    pub frame_size_bytes_max: u32,
    /// Attempts at a metadata request (over every known broker) before
    /// giving up. Default 3; 1..=100.
    pub metadata_attempts_max: u32,
    /// Pause between metadata attempts. Default 100 ms; 0..=60 000.
    pub metadata_backoff_ms: u64,
    /// How long one broker may take to answer a metadata request before
    /// the next is asked: a paused or cut-off broker must not hold up
    /// finding the new leader. Default 5 000 ms; 1..=600 000.
    pub metadata_timeout_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            client_id: "ringlog".to_owned(),
            in_flight_requests_max: 64,
            request_timeout_ms: 30_000,
            connect_timeout_ms: 10_000,
            frame_size_bytes_max: FRAME_SIZE_BYTES_MAX_DEFAULT,
            metadata_attempts_max: 3,
            metadata_backoff_ms: 100,
            metadata_timeout_ms: 5_000,
        }
    }
}

impl ClientConfig {
    pub fn validate(&self) -> Result<()> {
        if self.client_id.len() > CLIENT_ID_BYTES_MAX {
            return Err(invalid("client_id", "longer than 256 bytes"));
        }
        check_range(
            "in_flight_requests_max",
            self.in_flight_requests_max as u64,
            1,
            1024,
        )?;
        check_range("request_timeout_ms", self.request_timeout_ms, 1, 3_600_000)?;
        check_range("connect_timeout_ms", self.connect_timeout_ms, 1, 600_000)?;
        check_range("metadata_timeout_ms", self.metadata_timeout_ms, 1, 600_000)?;
        check_range(
            "frame_size_bytes_max",
            u64::from(self.frame_size_bytes_max),
            1 << 10,
            1 << 30,
        )?;
        check_range(
            "metadata_attempts_max",
            u64::from(self.metadata_attempts_max),
            1,
            100,
        )?;
        check_range("metadata_backoff_ms", self.metadata_backoff_ms, 0, 60_000)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

/// How many acknowledgements a produce request waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acks {
    /// No response at all; a record counts as delivered once written to the socket.
    None,
    /// After the leader appended the batch.
    Leader,
    /// After the write is durable under the flush policy and on every in-sync replica.
    All,
}

impl Acks {
    pub fn wire_value(self) -> i16 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

/// Producer settings.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// Default `Acks::All`.
    pub acks: Acks,
    /// How long a partition's open batch waits for more records before it is
    /// sent. Default 5 ms; 0..=60 000.
    pub linger_ms: u64,
    /// A batch is sent once its uncompressed size would pass this. Default
    /// 64 KiB; 1 KiB..=16 MiB.
    pub batch_bytes_max: usize,
    /// Bound on one record's encoded size; a record over `batch_bytes_max`
    /// travels alone in its batch. Default 1 MiB; at least `batch_bytes_max`
    /// is not required, at most 64 MiB.
    pub record_bytes_max: usize,
    /// Bound on record bytes accepted and not yet delivered; `enqueue` waits
    /// while it is reached. Default 32 MiB; at least `record_bytes_max`.
    pub buffer_bytes_max: usize,
    /// Default `Compression::None`; zstd uses level 1.
    pub compression: Compression,
    /// Further attempts after a retriable failure. Default 5; 0..=100.
    pub retries_max: u32,
    /// First retry backoff, doubled per attempt. Default 100 ms; 0..=60 000.
    pub retry_backoff_ms: u64,
    /// Bound on one backoff. Default 5 000 ms; at least `retry_backoff_ms`.
    pub retry_backoff_ms_max: u64,
    /// Sent in the request: how long the broker may wait for acks. Default
    /// 30 000 ms; 1..=i32::MAX.
    pub produce_timeout_ms: u64,
    /// Number every batch per partition under a producer id from the
    /// cluster, so a retried batch the broker already appended is not
    /// appended again. Default on, as in Kafka clients since 3.0; not used
    /// with `Acks::None`, which never retries.
    pub idempotence: bool,
    /// Batches of one partition an idempotent producer keeps in flight;
    /// order holds across retries (the broker appends a partition's batches
    /// in sequence order and recognises a repeat of any of the last five).
    /// Without idempotence it is 1. Default 5 (as Kafka's
    /// `max.in.flight.requests.per.connection`); 1..=5.
    pub in_flight_batches_per_partition_max: usize,
    /// Makes the producer transactional (`init_transactions`, `begin`,
    /// `commit`, `abort`): the id names the producer across restarts, so a
    /// new instance fences the previous one. Requires idempotence and
    /// `Acks::All`. 1..=255 bytes. Default none.
    pub transactional_id: Option<String>,
    /// A transaction open longer than this is aborted by its coordinator.
    /// Default 60 000 ms, within 1 000..=900 000.
    pub transaction_timeout_ms: u32,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            acks: Acks::All,
            linger_ms: 5,
            batch_bytes_max: 64 << 10,
            record_bytes_max: 1 << 20,
            buffer_bytes_max: 32 << 20,
            compression: Compression::None,
            retries_max: 5,
            retry_backoff_ms: 100,
            retry_backoff_ms_max: 5_000,
            produce_timeout_ms: 30_000,
            idempotence: true,
            in_flight_batches_per_partition_max: crate::accumulator::IN_FLIGHT_PER_PARTITION_MAX,
            transactional_id: None,
            transaction_timeout_ms: 60_000,
        }
    }
}

impl ProducerConfig {
    pub fn validate(&self) -> Result<()> {
        check_range("linger_ms", self.linger_ms, 0, 60_000)?;
        check_range(
            "batch_bytes_max",
            self.batch_bytes_max as u64,
            1 << 10,
            16 << 20,
        )?;
        check_range(
            "record_bytes_max",
            self.record_bytes_max as u64,
            64,
            64 << 20,
        )?;
        check_range(
            "buffer_bytes_max",
            self.buffer_bytes_max as u64,
            self.record_bytes_max.max(self.batch_bytes_max) as u64,
            1 << 40,
        )?;
        check_range("retries_max", u64::from(self.retries_max), 0, 100)?;
        check_range(
            "in_flight_batches_per_partition_max",
            self.in_flight_batches_per_partition_max as u64,
            1,
            crate::accumulator::IN_FLIGHT_PER_PARTITION_MAX as u64,
        )?;
        check_range("retry_backoff_ms", self.retry_backoff_ms, 0, 60_000)?;
        check_range(
            "retry_backoff_ms_max",
            self.retry_backoff_ms_max,
            self.retry_backoff_ms,
            600_000,
        )?;
        check_range(
            "produce_timeout_ms",
            self.produce_timeout_ms,
            1,
            i32::MAX as u64,
        )?;
        check_range(
            "transaction_timeout_ms",
            u64::from(self.transaction_timeout_ms),
            1_000,
            900_000,
        )?;
        if let Some(id) = &self.transactional_id {
            check_range("transactional_id bytes", id.len() as u64, 1, 255)?;
            if !self.idempotence || self.acks != Acks::All {
                return Err(invalid(
                    "transactional_id",
                    "a transactional producer needs idempotence and acks=all",
                ));
            }
        }
        Ok(())
    }

    /// Backoff before retry number `attempt` (1-based): exponential, bounded.
    pub fn retry_backoff(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(20);
        Duration::from_millis(
            self.retry_backoff_ms
                .saturating_mul(factor)
                .min(self.retry_backoff_ms_max),
        )
    }
}

/// Where a consumer starts when it has no position or its position left the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetReset {
    Earliest,
    Latest,
    /// Fail the poll with `ClientError::OffsetOutOfRange`.
    Error,
}

/// Which records a consumer sees. `ReadCommitted` (the default, as in
/// Kafka's stream processors) reads up to the last stable offset and skips
/// the records of aborted transactions; `ReadUncommitted` reads everything
/// below the high watermark, open and aborted transactions included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IsolationLevel {
    ReadUncommitted,
    #[default]
    ReadCommitted,
}

impl IsolationLevel {
    /// The wire's `isolation_level`.
    pub fn wire(self) -> u8 {
        match self {
            IsolationLevel::ReadUncommitted => 0,
            IsolationLevel::ReadCommitted => 1,
        }
    }
}

/// Consumer settings.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// How long the broker may hold a fetch waiting for data. Default 500 ms;
    /// 0..=60 000, and below the client's request timeout.
    pub fetch_wait_ms_max: u64,
    /// The broker answers once this many bytes are available. Default 1; 1..=16 MiB.
    pub fetch_bytes_min: u32,
    /// Bound on one fetch response's records. Default 50 MiB; 1 KiB..=1 GiB.
    pub fetch_bytes_max: u32,
    /// Bound on one partition's records in a fetch. Default 1 MiB; 1 KiB..=1 GiB.
    pub partition_fetch_bytes_max: u32,
    /// Bound on one decompressed records section. Default 64 MiB; 1 KiB..=1 GiB.
    pub decompressed_bytes_max: usize,
    /// Bound on records held between fetches and polls; no fetch is sent
    /// while it is reached. Default 100 000; 1..=10 000 000.
    pub buffered_records_max: usize,
    /// Bound on records one `poll` returns. Default 10 000; 1..=1 000 000.
    pub poll_records_max: usize,
    /// Starting point for newly assigned partitions and after OFFSET_OUT_OF_RANGE.
    /// Default `Earliest`.
    pub offset_reset: OffsetReset,
    /// Pause before re-fetching a partition after a retriable error. Default
    /// 100 ms; 0..=60 000.
    pub retry_backoff_ms: u64,
    /// Default `ReadCommitted`.
    pub isolation_level: IsolationLevel,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            fetch_wait_ms_max: 500,
            fetch_bytes_min: 1,
            fetch_bytes_max: 50 << 20,
            partition_fetch_bytes_max: 1 << 20,
            decompressed_bytes_max: 64 << 20,
            buffered_records_max: 100_000,
            poll_records_max: 10_000,
            offset_reset: OffsetReset::Earliest,
            retry_backoff_ms: 100,
            isolation_level: IsolationLevel::ReadCommitted,
        }
    }
}

impl ConsumerConfig {
    pub fn validate(&self, client: &ClientConfig) -> Result<()> {
        check_range(
            "fetch_wait_ms_max",
            self.fetch_wait_ms_max,
            0,
            60_000.min(client.request_timeout_ms.saturating_sub(1)),
        )?;
        check_range(
            "fetch_bytes_min",
            u64::from(self.fetch_bytes_min),
            1,
            16 << 20,
        )?;
        check_range(
            "fetch_bytes_max",
            u64::from(self.fetch_bytes_max),
            1 << 10,
            1 << 30,
        )?;
        check_range(
            "partition_fetch_bytes_max",
            u64::from(self.partition_fetch_bytes_max),
            1 << 10,
            1 << 30,
        )?;
        check_range(
            "decompressed_bytes_max",
            self.decompressed_bytes_max as u64,
            1 << 10,
            1 << 30,
        )?;
        check_range(
            "buffered_records_max",
            self.buffered_records_max as u64,
            1,
            10_000_000,
        )?;
        check_range(
            "poll_records_max",
            self.poll_records_max as u64,
            1,
            1_000_000,
        )?;
        check_range("retry_backoff_ms", self.retry_backoff_ms, 0, 60_000)
    }
}

/// Consumer group settings (`GroupConsumer`).
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// The group to join (Kafka's `group.id`). Required; 1..=255 bytes.
    pub group_id: String,
    /// Makes the member static (Kafka's `group.instance.id`): on close it
    /// leaves with epoch -2 and keeps its partitions until its session
    /// ends, so a restart under the same id takes them back without a
    /// rebalance. Default `None`; 1..=255 bytes when set.
    pub instance_id: Option<String>,
    /// The coordinator removes the member after this long without a
    /// heartbeat; heartbeats are sent from `poll`, so this also bounds the
    /// time between polls. Default 45 000 ms; 1 000..=300 000.
    pub session_timeout_ms: u32,
    /// How long the member may take to give up revoked partitions before
    /// it is fenced. Default 300 000 ms; 1 000..=3 600 000.
    pub rebalance_timeout_ms: u32,
    /// `sticky` or `range`; `None` keeps the group's (sticky for a new group).
    pub assignor: Option<String>,
    /// Commit what `poll` returned every `auto_commit_interval_ms`, before
    /// giving up revoked partitions and on close (Kafka's
    /// `enable.auto.commit`). Default true.
    pub enable_auto_commit: bool,
    /// Default 5 000 ms; 1..=3 600 000.
    pub auto_commit_interval_ms: u64,
    /// Commit the positions of revoked partitions before giving them up even
    /// when auto-commit is off. Default false.
    pub commit_on_revoke: bool,
    /// First pause after a failed heartbeat or coordinator lookup, doubled
    /// per failure in a row. Default 100 ms; 1..=60 000.
    pub retry_backoff_ms: u64,
    /// Bound on one such pause. Default 1 000 ms; `retry_backoff_ms`..=60 000.
    pub retry_backoff_ms_max: u64,
    /// Bound on one group request (commit, committed offsets, leave),
    /// finding the coordinator and retries included. Default 30 000 ms;
    /// 1..=600 000.
    pub request_wait_ms_max: u64,
    /// Fetch settings; its `offset_reset` is Kafka's `auto.offset.reset`:
    /// where a partition without a committed offset starts.
    pub consumer: ConsumerConfig,
}

impl Default for GroupConfig {
    /// Every default but the group id, which must be set.
    fn default() -> Self {
        GroupConfig {
            group_id: String::new(),
            instance_id: None,
            session_timeout_ms: 45_000,
            rebalance_timeout_ms: 300_000,
            assignor: None,
            enable_auto_commit: true,
            auto_commit_interval_ms: 5_000,
            commit_on_revoke: false,
            retry_backoff_ms: 100,
            retry_backoff_ms_max: 1_000,
            request_wait_ms_max: 30_000,
            consumer: ConsumerConfig::default(),
        }
    }
}

impl GroupConfig {
    /// The defaults for `group_id`.
    pub fn new(group_id: impl Into<String>) -> GroupConfig {
        GroupConfig {
            group_id: group_id.into(),
            ..GroupConfig::default()
        }
    }

    pub fn validate(&self, client: &ClientConfig) -> Result<()> {
        let name_bytes_max = GROUP_ID_BYTES_MAX as u64;
        check_range("group_id", self.group_id.len() as u64, 1, name_bytes_max)?;
        if let Some(instance_id) = &self.instance_id {
            check_range("instance_id", instance_id.len() as u64, 1, name_bytes_max)?;
        }
        if let Some(assignor) = &self.assignor {
            check_range("assignor", assignor.len() as u64, 1, name_bytes_max)?;
        }
        check_range(
            "session_timeout_ms",
            u64::from(self.session_timeout_ms),
            1_000,
            300_000,
        )?;
        check_range(
            "rebalance_timeout_ms",
            u64::from(self.rebalance_timeout_ms),
            1_000,
            3_600_000,
        )?;
        check_range(
            "auto_commit_interval_ms",
            self.auto_commit_interval_ms,
            1,
            3_600_000,
        )?;
        check_range("retry_backoff_ms", self.retry_backoff_ms, 1, 60_000)?;
        check_range(
            "retry_backoff_ms_max",
            self.retry_backoff_ms_max,
            self.retry_backoff_ms,
            60_000,
        )?;
        check_range("request_wait_ms_max", self.request_wait_ms_max, 1, 600_000)?;
        self.consumer.validate(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_config_is_validated_per_field() {
        // Proves the group defaults are valid once a group id is set, and
        // that each bad field is refused by name.
        let client = ClientConfig::default();
        assert!(GroupConfig::new("g").validate(&client).is_ok());
        let refused = |config: GroupConfig| match config.validate(&client) {
            Err(ClientError::InvalidConfig { field, .. }) => field,
            other => panic!("accepted: {other:?}"),
        };
        assert_eq!(refused(GroupConfig::default()), "group_id");
        let short_session = GroupConfig {
            session_timeout_ms: 999,
            ..GroupConfig::new("g")
        };
        assert_eq!(refused(short_session), "session_timeout_ms");
        let empty_instance = GroupConfig {
            instance_id: Some(String::new()),
            ..GroupConfig::new("g")
        };
        assert_eq!(refused(empty_instance), "instance_id");
        let backoffs = GroupConfig {
            retry_backoff_ms: 500,
            retry_backoff_ms_max: 100,
            ..GroupConfig::new("g")
        };
        assert_eq!(refused(backoffs), "retry_backoff_ms_max");
    }
}
