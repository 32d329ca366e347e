//! Consume-transform-produce, exactly once: reads INPUT as a member of
//! GROUP, writes each record's value prefixed with `T:` to OUTPUT (same key,
//! so the same partition when both topics have as many), and commits the
//! consumed offsets in the same transaction as the output. A crash at any
//! point (kill -9 included) leaves either the whole transaction (output and
//! offsets) or none of it, so a restarted instance resumes exactly where the
//! last committed transaction ended: read_committed readers of OUTPUT see
//! every input record transformed once.
//!
//! `cargo run -p client --example transform -- BOOTSTRAP INPUT OUTPUT GROUP
//! TRANSACTIONAL_ID [SESSION_TIMEOUT_MS] [IDLE_EXIT_MS]
//! [RECORDS_PER_TRANSACTION]`: exits 0 after IDLE_EXIT_MS (default: never)
//! without a record; on a failed transaction it aborts and exits 1, to be
//! restarted. A transaction takes at most RECORDS_PER_TRANSACTION records
//! (default 500).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{
    ClientConfig, GroupConfig, GroupConsumer, OffsetReset, Producer, ProducerConfig,
    ProducerRecord, TopicPartition,
};

/// Records taken into one transaction at most, by default.
const TRANSACTION_RECORDS_DEFAULT: usize = 500;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!("usage: transform BOOTSTRAP INPUT OUTPUT GROUP TRANSACTIONAL_ID [SESSION_TIMEOUT_MS] [IDLE_EXIT_MS] [RECORDS_PER_TRANSACTION]");
        std::process::exit(2);
    }
    let (bootstrap, input, output, group, transactional_id) =
        (&args[1], &args[2], &args[3], &args[4], &args[5]);
    let session_timeout_ms: u32 = args.get(6).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let idle_exit = args
        .get(7)
        .and_then(|s| s.parse().ok())
        .map(Duration::from_millis);
    let per_transaction: usize = args
        .get(8)
        .and_then(|s| s.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(TRANSACTION_RECORDS_DEFAULT);

    let mut config = GroupConfig::new(group.clone());
    config.session_timeout_ms = session_timeout_ms;
    // Offsets are committed by the transactions, never on their own.
    config.enable_auto_commit = false;
    config.consumer.offset_reset = OffsetReset::Earliest;
    // One transaction per poll: heartbeats (sent by poll) keep flowing
    // however long the input is.
    config.consumer.poll_records_max = per_transaction;
    let mut consumer = GroupConsumer::connect(bootstrap, ClientConfig::default(), config)
        .await
        .expect("connect the consumer");
    consumer
        .subscribe(std::slice::from_ref(input))
        .expect("subscribe");
    let producer = Producer::connect(
        bootstrap,
        ClientConfig::default(),
        ProducerConfig {
            transactional_id: Some(transactional_id.clone()),
            linger_ms: 1,
            ..ProducerConfig::default()
        },
    )
    .await
    .expect("connect the producer");
    // Fences an earlier instance and aborts what it left open.
    producer
        .init_transactions()
        .await
        .expect("init transactions");

    let mut last_record = Instant::now();
    let mut processed = 0u64;
    loop {
        let records = consumer
            .poll(Duration::from_millis(200))
            .await
            .expect("poll");
        if records.is_empty() {
            if idle_exit.is_some_and(|idle| last_record.elapsed() >= idle) {
                break;
            }
            continue;
        }
        last_record = Instant::now();
        for chunk in records.chunks(per_transaction) {
            producer.begin_transaction().expect("begin");
            let mut offsets: BTreeMap<TopicPartition, i64> = BTreeMap::new();
            let mut deliveries = Vec::with_capacity(chunk.len());
            for record in chunk {
                let mut value = b"T:".to_vec();
                value.extend_from_slice(record.value.as_deref().unwrap_or_default());
                let out = ProducerRecord {
                    topic: output.clone(),
                    partition: Some(record.partition),
                    key: record.key.clone(),
                    value: Some(Bytes::from(value)),
                    ..ProducerRecord::default()
                };
                deliveries.push(producer.enqueue(out).await.expect("enqueue"));
                offsets.insert(
                    TopicPartition::new(input.clone(), record.partition),
                    record.offset + 1,
                );
            }
            let done = async {
                for delivery in deliveries {
                    delivery.await?;
                }
                producer
                    .send_offsets_to_transaction(&offsets, &consumer.group_metadata())
                    .await?;
                producer.commit_transaction().await
            };
            if let Err(e) = done.await {
                eprintln!("transaction failed ({e}); aborting, restart to resume");
                let _ = producer.abort_transaction().await;
                std::process::exit(1);
            }
            processed += chunk.len() as u64;
        }
        println!("processed {processed}");
    }
    producer.close().await.expect("close the producer");
    consumer.close().await.expect("close the consumer");
}
