//! A quick closed-loop throughput probe: produces records of a given size as
//! fast as the producer accepts them and prints the achieved rate. The load
//! generator (`ringlog-loadgen run`) is the real measuring tool; this is a
//! building block for profiling the producer path alone.
//!
//! `cargo run --release -p client --example produce_rate -- 127.0.0.1:9092 topic 1000000 500`

use std::time::Instant;

use bytes::Bytes;
use client::{Acks, ClientConfig, Producer, ProducerConfig, ProducerRecord};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bootstrap = args.get(1).map_or("127.0.0.1:9092", String::as_str);
    let topic = args.get(2).map_or("bench", String::as_str).to_owned();
    let count: usize = args
        .get(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let size: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(500);
    let config = ProducerConfig {
        acks: Acks::Leader,
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(bootstrap, ClientConfig::default(), config)
        .await
        .expect("connect");
    let value = Bytes::from(vec![b'x'; size]);
    let started = Instant::now();
    let mut pending = Vec::with_capacity(4096);
    for i in 0..count {
        let record = ProducerRecord {
            topic: topic.clone(),
            partition: Some((i % 8) as i32),
            value: Some(value.clone()),
            ..ProducerRecord::default()
        };
        pending.push(producer.enqueue(record).await.expect("enqueue"));
        if pending.len() == 4096 {
            for delivery in pending.drain(..) {
                delivery.await.expect("delivered");
            }
        }
    }
    for delivery in pending {
        delivery.await.expect("delivered");
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{count} records of {size} B in {elapsed:.2} s: {:.0} msg/s, {:.1} MB/s",
        count as f64 / elapsed,
        (count * size) as f64 / elapsed / 1e6
    );
    producer.close().await.expect("close");
}
