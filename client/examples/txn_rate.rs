//! The cost of transactions: produces RATE records/s of SIZE bytes to TOPIC
//! for DURATION_S seconds, open loop, either plainly (`plain`: acks=all,
//! idempotent) or in transactions of TXN_MS (`txn`), and prints the
//! achieved rate and the latency from each record's scheduled send time to
//! the moment it became visible to read_committed readers: its
//! acknowledgement (plain) or the commit of its transaction (txn). Measured
//! from the schedule, so a stall (a commit) counts for every record it
//! delays.
//!
//! `cargo run --release -p client --example txn_rate -- BOOTSTRAP TOPIC
//! plain|txn [RATE=100000] [DURATION_S=20] [TXN_MS=100] [SIZE=500]`

use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{ClientConfig, Producer, ProducerConfig, ProducerRecord};
use hdrhistogram::Histogram;
use tokio::sync::mpsc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 || !["plain", "txn"].contains(&args[3].as_str()) {
        eprintln!("usage: txn_rate BOOTSTRAP TOPIC plain|txn [RATE] [DURATION_S] [TXN_MS] [SIZE]");
        std::process::exit(2);
    }
    let (bootstrap, topic, transactional) = (&args[1], args[2].clone(), args[3] == "txn");
    let arg = |i: usize, default: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let rate = arg(4, 100_000).max(1);
    let duration = Duration::from_secs(arg(5, 20));
    let txn_window = Duration::from_millis(arg(6, 100));
    let size = arg(7, 500) as usize;

    let config = ProducerConfig {
        transactional_id: transactional.then(|| format!("txn-rate-{}", std::process::id())),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(bootstrap, ClientConfig::default(), config)
        .await
        .expect("connect");
    if transactional {
        producer
            .init_transactions()
            .await
            .expect("init transactions");
    }
    let value = Bytes::from(vec![b'x'; size]);
    let (latency_tx, mut latency_rx) = mpsc::unbounded_channel::<Duration>();
    let collector = tokio::spawn(async move {
        let mut histogram = Histogram::<u64>::new(3).expect("histogram");
        while let Some(latency) = latency_rx.recv().await {
            let _ = histogram.record(latency.as_micros() as u64);
        }
        histogram
    });

    let start = Instant::now();
    let interval = Duration::from_nanos(1_000_000_000 / rate);
    let mut sent = 0u64;
    let mut window_started = Instant::now();
    let mut window: Vec<Instant> = Vec::new();
    if transactional {
        producer.begin_transaction().expect("begin");
    }
    while start.elapsed() < duration {
        let scheduled = start + interval * u32::try_from(sent).unwrap_or(u32::MAX);
        let now = Instant::now();
        if scheduled > now + Duration::from_millis(1) {
            tokio::time::sleep_until(scheduled.into()).await;
        }
        let record = ProducerRecord {
            topic: topic.clone(),
            key: Some(Bytes::from((sent % 1024).to_string())),
            value: Some(value.clone()),
            ..ProducerRecord::default()
        };
        let delivery = producer.enqueue(record).await.expect("enqueue");
        sent += 1;
        if transactional {
            window.push(scheduled);
            if window_started.elapsed() >= txn_window {
                producer.commit_transaction().await.expect("commit");
                let visible = Instant::now();
                for s in window.drain(..) {
                    let _ = latency_tx.send(visible - s);
                }
                producer.begin_transaction().expect("begin");
                window_started = Instant::now();
            }
            drop(delivery);
        } else {
            let tx = latency_tx.clone();
            tokio::spawn(async move {
                if delivery.await.is_ok() {
                    let _ = tx.send(scheduled.elapsed());
                }
            });
        }
    }
    if transactional {
        producer.commit_transaction().await.expect("commit");
        let visible = Instant::now();
        for s in window.drain(..) {
            let _ = latency_tx.send(visible - s);
        }
    }
    producer.flush().await.expect("flush");
    let elapsed = start.elapsed();
    drop(latency_tx);
    let histogram = collector.await.expect("collector");
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "mode={} rate_offered={} sent={} achieved={:.0}/s visible_latency_ms p50={:.2} p99={:.2} p99.9={:.2} max={:.2} measured={}",
        args[3],
        rate,
        sent,
        sent as f64 / elapsed.as_secs_f64(),
        ms(0.5),
        ms(0.99),
        ms(0.999),
        histogram.max() as f64 / 1000.0,
        histogram.len()
    );
    producer.close().await.expect("close");
}
