//! The admin HTTP endpoint: `GET /metrics` in the Prometheus text format, with
//! every shard's metrics gathered through the mesh. Minimal HTTP/1.0: one
//! request per connection, bounded request size.

use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::{self, net::Listener};
use crate::shard::{Shard, ShardOp, ShardReply};

/// Bytes of an HTTP request read before answering.
const HTTP_REQUEST_BYTES_MAX: usize = 8 * 1024;
const HTTP_READ_MS_MAX: u64 = 5_000;

const HEADERS: &str = "# HELP ringlog_requests_total Requests handled, by API.
# TYPE ringlog_requests_total counter
# HELP ringlog_request_latency_seconds Time from a request's last byte read to its response queued.
# TYPE ringlog_request_latency_seconds histogram
# TYPE ringlog_request_bytes_total counter
# TYPE ringlog_response_bytes_total counter
# TYPE ringlog_appended_records_total counter
# TYPE ringlog_connections_open gauge
# TYPE ringlog_connections_total counter
# TYPE ringlog_connections_refused_total counter
# TYPE ringlog_bad_frames_total counter
# TYPE ringlog_storage_errors_total counter
# TYPE ringlog_batch_cache_bytes gauge
# HELP ringlog_log_appended_batches_total Batches appended to the logs of the partition replicas the shard hosts now (since each was opened).
# TYPE ringlog_log_appended_batches_total counter
# HELP ringlog_log_appended_bytes_total Bytes appended to the same replicas' logs.
# TYPE ringlog_log_appended_bytes_total counter
# HELP ringlog_log_chunk_writes_total Direct writes of tail chunks to segment files, same replicas.
# TYPE ringlog_log_chunk_writes_total counter
# HELP ringlog_log_read_bytes_total Bytes read from segment files for reads the batch cache and the unwritten tail did not answer, same replicas.
# TYPE ringlog_log_read_bytes_total counter
# HELP ringlog_log_rescanned_segments_total Segments checked batch by batch when their log opened (after a crash, or with no record of a clean shutdown), same replicas.
# TYPE ringlog_log_rescanned_segments_total counter
# HELP ringlog_log_data_syncs_total fdatasync calls that made appended data durable (a group commit counts once), same replicas.
# TYPE ringlog_log_data_syncs_total counter
# HELP ringlog_log_journal_commits_total Commits under flush.policy=always made durable by the shard's journal instead of syncs of the segment files, same replicas.
# TYPE ringlog_log_journal_commits_total counter
# HELP ringlog_log_journal_fallbacks_total Commits under flush.policy=always that synced the segment files although a journal is attached (a policy change, a refused or failed round), same replicas.
# TYPE ringlog_log_journal_fallbacks_total counter
# HELP ringlog_journal_rounds_total Writes of the shard's journal ring, each holding every log's records handed over meanwhile.
# TYPE ringlog_journal_rounds_total counter
# HELP ringlog_journal_records_total Records (chunk images and fences) written to the shard's journal.
# TYPE ringlog_journal_records_total counter
# HELP ringlog_journal_written_bytes_total Bytes written to the shard's journal ring, block padding included.
# TYPE ringlog_journal_written_bytes_total counter
# HELP ringlog_journal_checkpoints_total Checkpoints of the shard's journal: segment files synced, then the ring's start moved past their records.
# TYPE ringlog_journal_checkpoints_total counter
# HELP ringlog_journal_checkpoint_waits_total Journal rounds that found the ring full and waited for a checkpoint.
# TYPE ringlog_journal_checkpoint_waits_total counter
# HELP ringlog_log_write_seconds Each direct write of a tail chunk, from its submission to its completion, same replicas.
# TYPE ringlog_log_write_seconds histogram
# HELP ringlog_log_sync_seconds Each commit that made appended data durable (the fdatasync of every file it covers, or the shard journal's round), same replicas.
# TYPE ringlog_log_sync_seconds histogram
# HELP ringlog_log_preallocations_total Segment files extended with allocated space ahead of their writes, so the writes complete inline, same replicas.
# TYPE ringlog_log_preallocations_total counter
# HELP ringlog_log_preallocations_refused_total Such extensions the file system refused (full disk, no fallocate); the writes then extend the file themselves, same replicas.
# TYPE ringlog_log_preallocations_refused_total counter
# HELP ringlog_log_end_offset Log end offset of each partition replica.
# TYPE ringlog_log_end_offset gauge
# HELP ringlog_cleaner_passes_total Compaction passes run.
# TYPE ringlog_cleaner_passes_total counter
# TYPE ringlog_cleaner_read_bytes_total counter
# TYPE ringlog_cleaner_written_bytes_total counter
# TYPE ringlog_cleaner_removed_records_total counter
# HELP ringlog_cleaner_errors_total Compaction passes that failed (the partition is then uncleanable).
# TYPE ringlog_cleaner_errors_total counter
# HELP ringlog_cleaner_dirty_ratio Share of a compacted partition's cleanable log written since its last pass.
# TYPE ringlog_cleaner_dirty_ratio gauge
# TYPE ringlog_cleaner_seconds_since_last_pass gauge
# HELP ringlog_cleaner_uncleanable 1 when a cleaner error stopped compaction of the partition until restart.
# TYPE ringlog_cleaner_uncleanable gauge
# HELP ringlog_groups Consumer groups this shard coordinates, by state.
# TYPE ringlog_groups gauge
# TYPE ringlog_group_records_written_total counter
# TYPE ringlog_group_offset_commits_total counter
# HELP ringlog_group_rebalances_total New group epochs (membership or subscription changes).
# TYPE ringlog_group_rebalances_total counter
# HELP ringlog_group_committed_offset Committed offset of a group on a partition.
# TYPE ringlog_group_committed_offset gauge
# HELP ringlog_group_lag_records High watermark minus committed offset, probed by the coordinator every lag_probe_interval_ms.
# TYPE ringlog_group_lag_records gauge
# HELP ringlog_group_lag_seconds Age of the oldest record the group has not consumed (0 when caught up), probed every lag_probe_interval_ms.
# TYPE ringlog_group_lag_seconds gauge
";

pub async fn serve_admin(shard: Rc<Shard>, listener: Listener) {
    let mut acceptor = listener.acceptor();
    while !shard.is_stopping() {
        let Some(Ok((mut reader, mut writer, _peer))) =
            acceptor.next_within(Duration::from_millis(100)).await
        else {
            continue;
        };
        let shard = shard.clone();
        runtime::spawn(async move {
            let mut request = vec![0u8; HTTP_REQUEST_BYTES_MAX];
            let mut len = 0;
            while len < request.len() && !request[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                match runtime::timeout(Duration::from_millis(HTTP_READ_MS_MAX), reader.read(&mut request[len..])).await {
                    Some(Ok(n)) if n > 0 => len += n,
                    _ => return,
                }
            }
            let line = String::from_utf8_lossy(&request[..len]).lines().next().unwrap_or_default().to_owned();
            let response = if line.starts_with("GET /metrics ") {
                let mut body = String::from(HEADERS);
                for to in 0..shard.count() {
                    if let ShardReply::Metrics(text) = shard.call(to, ShardOp::RenderMetrics).await {
                        body.push_str(&text);
                    }
                }
                format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}", body.len())
            } else {
                "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_owned()
            };
            let _ = writer.write_all(response.as_bytes()).await;
            let _ = writer.close().await;
        })
        .detach();
    }
}
