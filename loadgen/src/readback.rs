//! Reading a whole topic back after a run, from the earliest offset to each
//! partition's high watermark, as (partition, offset, value id): what the log
//! holds, as opposed to what tailing consumers happened to see during the run
//! (which may have come from a broker's memory). The fault suite compares it
//! with the acknowledged history.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use client::messages::{self, FetchEntry};
use client::{ClientConfig, Cluster, IsolationLevel};
use protocol::{ApiKey, ErrorCode, RecordBatch};

use crate::payload::{decode_header, PayloadKind};
use crate::verify::HistoryRecord;

/// Bound on one fetch response while reading back.
const READBACK_FETCH_BYTES_MAX: i32 = 16 << 20;
/// Pause before retrying a partition whose leader is not ready.
const READBACK_RETRY_MS: u64 = 200;

/// Every record of `topic` from the earliest offset up to each partition's
/// end, within `timeout`. A partition's end is taken once its leader's high
/// watermark reached its log end (the high watermark is learned again after a
/// restart, so reading up to an early one would miss committed records).
pub async fn read_back(
    bootstrap: &str,
    topic: &str,
    payload: PayloadKind,
    timeout: Duration,
) -> anyhow::Result<Vec<HistoryRecord>> {
    let deadline = Instant::now() + timeout;
    let cluster = Cluster::connect(bootstrap, ClientConfig::default())
        .await
        .context("connecting to read back")?;
    let partitions = cluster.topic(topic, 20).await?.partition_count() as i32;
    let mut out = Vec::new();
    for partition in 0..partitions {
        let (start, end) = offsets(&cluster, topic, partition, deadline).await?;
        let mut next = start;
        while next < end {
            if Instant::now() >= deadline {
                bail!("{topic}-{partition}: read back to {next} of {end} before the deadline");
            }
            match fetch(&cluster, topic, partition, next, payload).await {
                Ok((records, after)) if after > next => {
                    out.extend(
                        records
                            .into_iter()
                            .filter(|r| (r.position.offset as i64) < end),
                    );
                    next = after;
                }
                Ok(_) | Err(_) => {
                    let _ = cluster.refresh_metadata().await;
                    tokio::time::sleep(Duration::from_millis(READBACK_RETRY_MS)).await;
                }
            }
        }
    }
    Ok(out)
}

/// (earliest, latest) offsets of a partition, retried until the deadline.
async fn offsets(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    deadline: Instant,
) -> anyhow::Result<(i64, i64)> {
    loop {
        let earliest = list_offset(cluster, topic, partition, messages::TIMESTAMP_EARLIEST).await;
        let settled = settled_end(cluster, topic, partition).await;
        if let (Ok(start), Ok(Some(end))) = (earliest, settled) {
            return Ok((start, end));
        }
        if Instant::now() >= deadline {
            bail!("{topic}-{partition}: no offsets before the deadline");
        }
        let _ = cluster.refresh_metadata().await;
        tokio::time::sleep(Duration::from_millis(READBACK_RETRY_MS)).await;
    }
}

/// The leader's high watermark if it equals its log end, from an empty
/// fetch (whose answer carries both).
async fn settled_end(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
) -> anyhow::Result<Option<i64>> {
    let connection = cluster.leader_connection(topic, partition).await?;
    let entry = FetchEntry {
        topic: topic.to_owned(),
        partition,
        fetch_offset: list_offset(cluster, topic, partition, messages::TIMESTAMP_LATEST).await?,
        max_bytes: 1,
    };
    let body = messages::fetch_request(0, 1, 1, IsolationLevel::ReadUncommitted, &[entry]);
    let response = connection.request(ApiKey::Fetch, &body, &[]).await?;
    let bytes = response.payload();
    let fetched = messages::fetch_response(response.body(), &bytes)?;
    Ok(fetched
        .first()
        .filter(|p| p.error == ErrorCode::None && p.high_watermark == p.log_end_offset)
        .map(|p| p.high_watermark))
}

async fn list_offset(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    timestamp_ms: i64,
) -> anyhow::Result<i64> {
    let connection = cluster.leader_connection(topic, partition).await?;
    let body = messages::list_offsets_request(
        topic,
        &[(partition, timestamp_ms)],
        IsolationLevel::ReadUncommitted,
    );
    let response = connection.request(ApiKey::ListOffsets, &body, &[]).await?;
    match messages::list_offsets_response(response.body(), topic)?.as_slice() {
        [(_, ErrorCode::None, offset)] => Ok(*offset),
        other => bail!("list offsets {topic}-{partition}: {other:?}"),
    }
}

/// One fetch from `offset`: the records and the offset after the last.
async fn fetch(
    cluster: &Cluster,
    topic: &str,
    partition: i32,
    offset: i64,
    payload: PayloadKind,
) -> anyhow::Result<(Vec<HistoryRecord>, i64)> {
    let connection = cluster.leader_connection(topic, partition).await?;
    let entry = FetchEntry {
        topic: topic.to_owned(),
        partition,
        fetch_offset: offset,
        max_bytes: READBACK_FETCH_BYTES_MAX,
    };
    let body = messages::fetch_request(
        0,
        1,
        READBACK_FETCH_BYTES_MAX,
        IsolationLevel::ReadUncommitted,
        &[entry],
    );
    let response = connection.request(ApiKey::Fetch, &body, &[]).await?;
    let bytes = response.payload();
    let fetched = messages::fetch_response(response.body(), &bytes)?;
    let mut records = Vec::new();
    let mut next = offset;
    for p in fetched {
        if p.error != ErrorCode::None {
            bail!("fetch {topic}-{partition}: {}", p.error);
        }
        let mut rest = &p.records[..];
        while !rest.is_empty() {
            let (batch, used) = RecordBatch::parse_prefix(rest, 64 << 20).context("batch")?;
            rest = &rest[used..];
            if batch.header().is_control() {
                // A transaction marker: no record of the workload.
                next = next.max(batch.header().last_offset().0 + 1);
                continue;
            }
            for record in batch.records_section(64 << 20).context("records")?.iter() {
                let record = record.context("record")?;
                if record.offset.0 < next {
                    continue;
                }
                let header = decode_header(payload, record.value.unwrap_or_default())
                    .context("payload header")?;
                records.push(HistoryRecord::new(
                    partition as u32,
                    record.offset.0 as u64,
                    header.value_id,
                ));
                next = record.offset.0 + 1;
            }
        }
    }
    Ok((records, next))
}
