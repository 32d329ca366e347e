//! `Consumer`: reads assigned partitions from their leaders' shard
//! endpoints. One fetch is in flight per leader endpoint at a time and the
//! next one is sent before buffered records are returned (prefetch), so the
//! network works while the application handles a poll. Positions are the
//! consumer's own; `GroupConsumer` (group.rs) builds consumer groups on top
//! of it, assigning, pausing and unassigning partitions as its coordinator
//! says.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::{ApiKey, ErrorCode};
use tokio::task::JoinSet;

use crate::accumulator::TopicPartition;
use crate::cluster::Cluster;
use crate::config::{ClientConfig, ConsumerConfig, IsolationLevel, OffsetReset};
use crate::consumer_record::{decode_records, ConsumerRecord, DecodedRecords};
use crate::error::{ClientError, Result};
use crate::messages::{self, FetchEntry, FetchedPartition, TIMESTAMP_EARLIEST, TIMESTAMP_LATEST};

/// How long a consumer's list-offsets lookup retries retriable answers
/// (a moved leader, a new leader whose high watermark is not established
/// yet) across metadata refreshes, as a Kafka consumer's
/// `default.api.timeout.ms` does; errors that are not retriable end it at
/// once.
pub(crate) const LIST_OFFSETS_RETRY_MS_MAX: u64 = 15_000;

/// Where `seek` moves a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTo {
    Earliest,
    /// The log end: only records produced from now on.
    Latest,
    Offset(i64),
    /// The first record with a timestamp at or after this (ms since the
    /// epoch); the log end when there is none.
    Timestamp(i64),
}

#[derive(Debug)]
struct PartitionState {
    /// Offset of the next record `poll` returns; `None` until reset by policy.
    position: Option<i64>,
    /// Offset the next fetch asks for: past every buffered record.
    fetch_offset: i64,
    buffered: VecDeque<ConsumerRecord>,
    in_flight: bool,
    /// Bumped by every seek or reset so stale fetch results are dropped.
    generation: u64,
    backoff_until: Option<Instant>,
    /// A paused partition is neither fetched nor returned by `poll`.
    paused: bool,
    high_watermark: i64,
    log_start_offset: i64,
    log_end_offset: i64,
}

impl PartitionState {
    fn new() -> PartitionState {
        PartitionState {
            position: None,
            fetch_offset: -1,
            buffered: VecDeque::new(),
            in_flight: false,
            generation: 0,
            backoff_until: None,
            paused: false,
            high_watermark: -1,
            log_start_offset: -1,
            log_end_offset: -1,
        }
    }

    fn check_invariants(&self) {
        if let Some(position) = self.position {
            assert!(
                position <= self.fetch_offset,
                "position is behind the fetch offset"
            );
            if let Some(first) = self.buffered.front() {
                assert!(
                    first.offset >= position,
                    "buffered records are not behind the position"
                );
            }
        } else {
            assert!(self.buffered.is_empty(), "no records without a position");
        }
        if self.paused {
            assert!(
                self.buffered.is_empty(),
                "no records held for a paused partition"
            );
        }
    }
}

/// One partition's part of a fetch, decoded in the fetch task.
#[derive(Debug)]
struct PartitionFetch {
    topic_partition: TopicPartition,
    generation: u64,
    fetch_offset: i64,
    result: Result<(FetchedPartition, DecodedRecords)>,
}

#[derive(Debug)]
struct FetchOutcome {
    address: String,
    requested: Vec<(TopicPartition, u64)>,
    result: Result<Vec<PartitionFetch>>,
}

/// A consumer of manually assigned partitions.
#[derive(Debug)]
pub struct Consumer {
    cluster: Cluster,
    config: ConsumerConfig,
    partitions: BTreeMap<TopicPartition, PartitionState>,
    fetches: JoinSet<FetchOutcome>,
    addresses_in_flight: HashSet<String>,
    records_buffered: usize,
    metadata_stale: bool,
    /// Source of `PartitionState::generation`: consumer-wide, so a partition
    /// unassigned and assigned again never takes an old fetch for a new one.
    generations: u64,
    /// Fetches sent, which rotate the order of their partitions.
    fetch_rounds: u64,
}

impl Consumer {
    pub async fn connect(
        bootstrap: &str,
        client_config: ClientConfig,
        config: ConsumerConfig,
    ) -> Result<Consumer> {
        Consumer::new(Cluster::connect(bootstrap, client_config).await?, config)
    }

    /// A consumer on `cluster`'s connections. A broker answers the requests
    /// of one connection in order, so consumers that share a `Cluster` wait
    /// for each other's fetches: one's empty long poll (up to
    /// `fetch_wait_ms_max`) holds back another's full answer. Consumers that
    /// must not wait for each other get a `Cluster` each, as `connect` does.
    pub fn new(cluster: Cluster, config: ConsumerConfig) -> Result<Consumer> {
        config.validate(cluster.config())?;
        Ok(Consumer {
            cluster,
            config,
            partitions: BTreeMap::new(),
            fetches: JoinSet::new(),
            addresses_in_flight: HashSet::new(),
            records_buffered: 0,
            metadata_stale: false,
            generations: 0,
            fetch_rounds: 0,
        })
    }

    /// Adds partitions of `topic` (all of them when `None`). New partitions
    /// start where `offset_reset` says, unless `seek` moves them first.
    pub async fn assign(&mut self, topic: &str, partitions: Option<&[i32]>) -> Result<Vec<i32>> {
        let metadata = self.cluster.topic(topic, 3).await?;
        let chosen: Vec<i32> = match partitions {
            None => metadata.partitions.iter().map(|p| p.partition).collect(),
            Some(list) => {
                for &p in list {
                    if metadata.partition(p).is_none() {
                        return Err(ClientError::UnknownPartition {
                            topic: topic.to_owned(),
                            partition: p,
                        });
                    }
                }
                list.to_vec()
            }
        };
        for &p in &chosen {
            if let std::collections::btree_map::Entry::Vacant(entry) =
                self.partitions.entry(TopicPartition::new(topic, p))
            {
                self.generations += 1;
                let mut state = PartitionState::new();
                state.generation = self.generations;
                entry.insert(state);
            }
        }
        Ok(chosen)
    }

    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.partitions.keys().cloned().collect()
    }

    /// Removes partitions from the assignment, dropping their buffered
    /// records; the result of a fetch in flight for them is ignored.
    /// Partitions not assigned are skipped.
    pub fn unassign(&mut self, partitions: &[TopicPartition]) {
        for tp in partitions {
            if let Some(state) = self.partitions.remove(tp) {
                self.records_buffered -= state.buffered.len();
            }
        }
    }

    /// Stops fetching and returning records of an assigned partition until
    /// `resume`. Its buffered records are dropped and fetched again after
    /// `resume`, so a paused partition holds no memory and never counts
    /// against `buffered_records_max`. Its position does not move.
    pub fn pause(&mut self, topic: &str, partition: i32) -> Result<()> {
        let tp = TopicPartition::new(topic, partition);
        let position = self.assigned(&tp)?.position;
        if let Some(position) = position {
            self.set_position(&tp, position);
        }
        let state = self.partitions.get_mut(&tp).expect("checked above");
        state.paused = true;
        state.check_invariants();
        Ok(())
    }

    /// Fetches and returns records of a paused partition again.
    pub fn resume(&mut self, topic: &str, partition: i32) -> Result<()> {
        let tp = TopicPartition::new(topic, partition);
        self.assigned(&tp)?;
        self.partitions.get_mut(&tp).expect("checked above").paused = false;
        Ok(())
    }

    /// The paused partitions, in order.
    pub fn paused(&self) -> Vec<TopicPartition> {
        self.partitions
            .iter()
            .filter(|(_, s)| s.paused)
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    fn assigned(&self, tp: &TopicPartition) -> Result<&PartitionState> {
        self.partitions
            .get(tp)
            .ok_or_else(|| ClientError::UnknownPartition {
                topic: tp.topic.clone(),
                partition: tp.partition,
            })
    }

    /// Offset of the next record `poll` returns for the partition; `None`
    /// when unassigned or not yet positioned.
    pub fn position(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partitions
            .get(&TopicPartition::new(topic, partition))
            .and_then(|s| s.position)
    }

    /// Moves an assigned partition; resolves earliest/latest/timestamp with
    /// ListOffsets at once. Drops buffered and in-flight records of it.
    pub async fn seek(&mut self, topic: &str, partition: i32, to: SeekTo) -> Result<i64> {
        let topic_partition = TopicPartition::new(topic, partition);
        if !self.partitions.contains_key(&topic_partition) {
            return Err(ClientError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            });
        }
        let offset = match to {
            SeekTo::Offset(offset) if offset >= 0 => offset,
            SeekTo::Offset(offset) => {
                return Err(ClientError::InvalidConfig {
                    field: "seek offset",
                    reason: format!("{offset} is negative"),
                })
            }
            SeekTo::Earliest => self.lookup(topic, partition, TIMESTAMP_EARLIEST).await?,
            SeekTo::Latest => self.lookup(topic, partition, TIMESTAMP_LATEST).await?,
            SeekTo::Timestamp(ts) => match self.lookup(topic, partition, ts).await? {
                -1 => self.lookup(topic, partition, TIMESTAMP_LATEST).await?,
                offset => offset,
            },
        };
        self.set_position(&topic_partition, offset);
        Ok(offset)
    }

    async fn lookup(&self, topic: &str, partition: i32, timestamp_ms: i64) -> Result<i64> {
        let offsets = self.list_offsets(topic, &[partition], timestamp_ms).await?;
        Ok(offsets[&partition])
    }

    fn set_position(&mut self, topic_partition: &TopicPartition, offset: i64) {
        let state = self
            .partitions
            .get_mut(topic_partition)
            .expect("positioning an assigned partition");
        self.records_buffered -= state.buffered.len();
        state.buffered.clear();
        state.position = Some(offset);
        state.fetch_offset = offset;
        self.generations += 1;
        state.generation = self.generations;
        state.backoff_until = None;
        state.check_invariants();
    }

    /// Where each partition's readable records end (ListOffsets latest): the
    /// high watermark, or the last stable offset under read_committed.
    pub async fn end_offsets(&self, topic: &str, partitions: &[i32]) -> Result<BTreeMap<i32, i64>> {
        self.list_offsets(topic, partitions, TIMESTAMP_LATEST).await
    }

    /// The log start offset of each partition (ListOffsets earliest).
    pub async fn beginning_offsets(
        &self,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>> {
        self.list_offsets(topic, partitions, TIMESTAMP_EARLIEST)
            .await
    }

    /// ListOffsets for `partitions`, one request per leader endpoint, retried
    /// over metadata refreshes while the answer is retriable.
    pub async fn list_offsets(
        &self,
        topic: &str,
        partitions: &[i32],
        timestamp_ms: i64,
    ) -> Result<BTreeMap<i32, i64>> {
        list_offsets(
            &self.cluster,
            topic,
            partitions,
            timestamp_ms,
            self.config.isolation_level,
            self.config_retry_backoff(),
            Duration::from_millis(LIST_OFFSETS_RETRY_MS_MAX),
        )
        .await
    }

    /// Returns buffered records, or waits up to `timeout` for some; an empty
    /// vector means none arrived in time. Each call also keeps one fetch in
    /// flight per leader endpoint.
    ///
    /// Cancel safe: records leave the buffer only in the step that returns
    /// them, and every await either changes nothing (a metadata refresh, a
    /// list-offsets lookup) or is a fetch task that goes on without it, so
    /// dropping the future loses no record and keeps every position.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.metadata_stale {
                // A failed refresh leaves the partitions backing off; the next
                // round tries again.
                let _ = self.cluster.refresh_metadata().await;
                self.metadata_stale = false;
            }
            self.reset_unpositioned().await?;
            self.start_fetches();
            if self.records_buffered > 0 {
                let records = self.drain_buffered();
                if !records.is_empty() {
                    return Ok(records);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let wake = self
                .partitions
                .values()
                .filter_map(|s| s.backoff_until)
                .filter(|at| *at > now)
                .min()
                .map_or(deadline, |at| at.min(deadline));
            tokio::select! {
                Some(joined) = self.fetches.join_next(), if !self.fetches.is_empty() => {
                    let outcome = joined.expect("fetch tasks do not panic");
                    self.handle_fetch(outcome)?;
                }
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }

    /// Positions partitions that have none, per `offset_reset`.
    async fn reset_unpositioned(&mut self) -> Result<()> {
        let unpositioned: Vec<TopicPartition> = self
            .partitions
            .iter()
            .filter(|(_, s)| s.position.is_none() && !s.in_flight)
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in unpositioned {
            let to = match self.config.offset_reset {
                OffsetReset::Earliest => SeekTo::Earliest,
                OffsetReset::Latest => SeekTo::Latest,
                OffsetReset::Error => {
                    return Err(ClientError::OffsetOutOfRange {
                        partition: tp.partition,
                        offset: -1,
                        log_start_offset: -1,
                        log_end_offset: -1,
                    })
                }
            };
            self.seek(&tp.topic, tp.partition, to).await?;
        }
        Ok(())
    }

    /// Sends a fetch to every leader endpoint that has none in flight, for
    /// its partitions that are positioned, idle and not backing off.
    fn start_fetches(&mut self) {
        if self.records_buffered >= self.config.buffered_records_max {
            return;
        }
        let now = Instant::now();
        let backoff = self.config_retry_backoff();
        let metadata = self.cluster.metadata();
        let mut by_address: BTreeMap<String, Vec<FetchEntry>> = BTreeMap::new();
        for (tp, state) in &mut self.partitions {
            if state.in_flight
                || state.paused
                || state.position.is_none()
                || state.backoff_until.is_some_and(|at| at > now)
            {
                continue;
            }
            let address = match metadata.leader_address(&tp.topic, tp.partition) {
                Ok(address) => address,
                Err(_) => {
                    self.metadata_stale = true;
                    state.backoff_until = Some(now + backoff);
                    continue;
                }
            };
            if self.addresses_in_flight.contains(&address) {
                continue;
            }
            by_address.entry(address).or_default().push(FetchEntry {
                topic: tp.topic.clone(),
                partition: tp.partition,
                fetch_offset: state.fetch_offset,
                max_bytes: self.config.partition_fetch_bytes_max as i32,
            });
        }
        for (address, mut entries) in by_address {
            // A broker fills a response in request order within its bound:
            // rotating the order each fetch gives every partition its turn
            // first, so none waits behind partitions with more to read.
            if !entries.is_empty() {
                let turn = (self.fetch_rounds % entries.len() as u64) as usize;
                entries.rotate_left(turn);
            }
            self.fetch_rounds = self.fetch_rounds.wrapping_add(1);
            let requested: Vec<(TopicPartition, u64)> = entries
                .iter()
                .map(|e| {
                    let tp = TopicPartition::new(e.topic.clone(), e.partition);
                    let state = self.partitions.get_mut(&tp).expect("assigned");
                    state.in_flight = true;
                    (tp, state.generation)
                })
                .collect();
            self.addresses_in_flight.insert(address.clone());
            let cluster = self.cluster.clone();
            let config = self.config.clone();
            self.fetches.spawn(async move {
                let result = fetch(&cluster, &address, &config, &entries, &requested).await;
                FetchOutcome {
                    address,
                    requested,
                    result,
                }
            });
        }
    }

    fn config_retry_backoff(&self) -> Duration {
        Duration::from_millis(self.config.retry_backoff_ms)
    }

    fn handle_fetch(&mut self, outcome: FetchOutcome) -> Result<()> {
        self.addresses_in_flight.remove(&outcome.address);
        for (tp, _) in &outcome.requested {
            if let Some(state) = self.partitions.get_mut(tp) {
                state.in_flight = false;
            }
        }
        let fetched = match outcome.result {
            Ok(fetched) => fetched,
            Err(error) => {
                if !error.is_retriable() {
                    return Err(error);
                }
                self.metadata_stale |= error.needs_metadata_refresh();
                let until = Instant::now() + self.config_retry_backoff();
                for (tp, _) in &outcome.requested {
                    if let Some(state) = self.partitions.get_mut(tp) {
                        state.backoff_until = Some(until);
                    }
                }
                return Ok(());
            }
        };
        let mut first_error = None;
        for partition_fetch in fetched {
            if let Err(error) = self.apply_partition_fetch(partition_fetch) {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn apply_partition_fetch(&mut self, fetch: PartitionFetch) -> Result<()> {
        let backoff = self.config_retry_backoff();
        let reset = self.config.offset_reset;
        let Some(state) = self.partitions.get_mut(&fetch.topic_partition) else {
            return Ok(());
        };
        if state.generation != fetch.generation || state.fetch_offset != fetch.fetch_offset {
            return Ok(()); // Sought elsewhere since the fetch was sent.
        }
        let (data, decoded) = fetch.result?;
        state.high_watermark = data.high_watermark;
        state.log_start_offset = data.log_start_offset;
        state.log_end_offset = data.log_end_offset;
        match data.error {
            ErrorCode::None => {
                assert!(
                    decoded.next_fetch_offset >= state.fetch_offset,
                    "fetch offsets never go back"
                );
                state.fetch_offset = decoded.next_fetch_offset;
                if state.buffered.is_empty() && decoded.records.is_empty() {
                    // Only batches nobody is shown (markers, aborted
                    // transactions) were fetched: the position moves past
                    // them, as it would past returned records.
                    state.position = state.position.map(|_| state.fetch_offset);
                }
                self.records_buffered += decoded.records.len();
                state.buffered.extend(decoded.records);
                state.check_invariants();
                Ok(())
            }
            ErrorCode::OffsetOutOfRange => {
                let offset = fetch.fetch_offset;
                let (start, end) = (data.log_start_offset, data.log_end_offset);
                let target = match reset {
                    OffsetReset::Error => {
                        return Err(ClientError::OffsetOutOfRange {
                            partition: data.partition,
                            offset,
                            log_start_offset: start,
                            log_end_offset: end,
                        })
                    }
                    _ if start < 0 || end < 0 => None,
                    OffsetReset::Earliest if offset < start => Some(start),
                    OffsetReset::Earliest | OffsetReset::Latest => Some(end),
                };
                match target {
                    Some(target) => self.set_position(&fetch.topic_partition, target),
                    None => {
                        self.records_buffered -= state.buffered.len();
                        state.buffered.clear();
                        state.position = None;
                        self.generations += 1;
                        state.generation = self.generations;
                    }
                }
                Ok(())
            }
            error if error.is_retriable() => {
                self.metadata_stale |= ClientError::broker(error, None).needs_metadata_refresh();
                state.backoff_until = Some(Instant::now() + backoff);
                Ok(())
            }
            error => Err(ClientError::broker(error, None)),
        }
    }

    /// Takes up to `poll_records_max` buffered records, partition by
    /// partition, advancing each position past what it returns.
    fn drain_buffered(&mut self) -> Vec<ConsumerRecord> {
        let mut out = Vec::with_capacity(self.records_buffered.min(self.config.poll_records_max));
        for state in self.partitions.values_mut().filter(|s| !s.paused) {
            while out.len() < self.config.poll_records_max {
                let Some(record) = state.buffered.pop_front() else {
                    break;
                };
                state.position = Some(record.offset + 1);
                out.push(record);
            }
            if state.buffered.is_empty() && state.position.is_some() {
                state.position = Some(state.fetch_offset);
            }
            state.check_invariants();
        }
        self.records_buffered -= out.len();
        out
    }
}

/// ListOffsets for `partitions` of `topic`, one request per leader
/// endpoint, retried over metadata refreshes while the answer is retriable
/// (rounds `retry_backoff` apart, none started after `retry_for`).
pub(crate) async fn list_offsets(
    cluster: &Cluster,
    topic: &str,
    partitions: &[i32],
    timestamp_ms: i64,
    isolation: IsolationLevel,
    retry_backoff: Duration,
    retry_for: Duration,
) -> Result<BTreeMap<i32, i64>> {
    let deadline = Instant::now() + retry_for;
    let mut found = BTreeMap::new();
    let mut last_error = None;
    for attempt in 0u32.. {
        let missing: Vec<i32> = partitions
            .iter()
            .copied()
            .filter(|p| !found.contains_key(p))
            .collect();
        if missing.is_empty() {
            return Ok(found);
        }
        if attempt > 0 {
            if Instant::now() + retry_backoff > deadline {
                break;
            }
            tokio::time::sleep(retry_backoff).await;
            cluster.refresh_metadata().await?;
        }
        match list_offsets_once(
            cluster,
            topic,
            &missing,
            timestamp_ms,
            isolation,
            &mut found,
        )
        .await
        {
            Ok(()) => {}
            Err(error) if error.is_retriable() => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| ClientError::UnknownTopic(topic.to_owned())))
}

async fn list_offsets_once(
    cluster: &Cluster,
    topic: &str,
    partitions: &[i32],
    timestamp_ms: i64,
    isolation: IsolationLevel,
    found: &mut BTreeMap<i32, i64>,
) -> Result<()> {
    let metadata = cluster.metadata();
    let mut by_address: BTreeMap<String, Vec<(i32, i64)>> = BTreeMap::new();
    for &p in partitions {
        let address = metadata.leader_address(topic, p)?;
        by_address
            .entry(address)
            .or_default()
            .push((p, timestamp_ms));
    }
    let mut first_error = None;
    for (address, entries) in by_address {
        let body = messages::list_offsets_request(topic, &entries, isolation);
        let response = cluster
            .request_to(&address, ApiKey::ListOffsets, &body, &[])
            .await?;
        for (partition, error, offset) in messages::list_offsets_response(response.body(), topic)? {
            if error.is_ok() {
                found.insert(partition, offset);
            } else if first_error.is_none() {
                first_error = Some(ClientError::broker(error, None));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Sends one fetch and decodes every partition's batches.
async fn fetch(
    cluster: &Cluster,
    address: &str,
    config: &ConsumerConfig,
    entries: &[FetchEntry],
    requested: &[(TopicPartition, u64)],
) -> Result<Vec<PartitionFetch>> {
    let body = messages::fetch_request(
        config.fetch_wait_ms_max as i32,
        config.fetch_bytes_min as i32,
        config.fetch_bytes_max as i32,
        config.isolation_level,
        entries,
    );
    let response = cluster
        .request_to(address, ApiKey::Fetch, &body, &[])
        .await?;
    let payload: Bytes = response.payload();
    let fetched = messages::fetch_response(response.body(), &payload)?;
    let mut out = Vec::with_capacity(fetched.len());
    for data in fetched {
        let Some(index) = entries
            .iter()
            .position(|e| e.topic == data.topic && e.partition == data.partition)
        else {
            continue; // Not asked for: ignore.
        };
        let (topic_partition, generation) = requested[index].clone();
        let fetch_offset = entries[index].fetch_offset;
        let result = if data.error.is_ok() {
            decode_records(
                &data.topic,
                data.partition,
                &data.records,
                fetch_offset,
                config.partition_fetch_bytes_max.max(config.fetch_bytes_max) as usize,
                config.decompressed_bytes_max,
                &data.aborted,
            )
            .map(|decoded| (data, decoded))
        } else {
            Ok((
                data,
                DecodedRecords {
                    records: Vec::new(),
                    next_fetch_offset: fetch_offset,
                },
            ))
        };
        out.push(PartitionFetch {
            topic_partition,
            generation,
            fetch_offset,
            result,
        });
    }
    Ok(out)
}
