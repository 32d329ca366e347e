//! Reading a whole topic back with the client library, for end-to-end checks.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use client::{ClientConfig, Consumer, ConsumerConfig, SeekTo};

/// (partition -> [(offset, key, value)]) of `topic`, read from the earliest
/// offset up to each partition's end offset (its high watermark).
pub async fn consume_all(
    bootstrap: &str,
    topic: &str,
) -> BTreeMap<i32, Vec<(i64, String, String)>> {
    let mut consumer = Consumer::connect(
        bootstrap,
        ClientConfig::default(),
        ConsumerConfig::default(),
    )
    .await
    .unwrap();
    let partitions = consumer.assign(topic, None).await.unwrap();
    let ends = consumer.end_offsets(topic, &partitions).await.unwrap();
    for &p in &partitions {
        consumer.seek(topic, p, SeekTo::Earliest).await.unwrap();
    }
    let mut out: BTreeMap<i32, Vec<(i64, String, String)>> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while partitions
        .iter()
        .any(|p| consumer.position(topic, *p).unwrap_or(0) < ends[p])
    {
        assert!(
            std::time::Instant::now() < deadline,
            "consumed up to the end offsets"
        );
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            let key = r
                .key
                .map(|k| String::from_utf8(k.to_vec()).unwrap())
                .unwrap_or_default();
            let value = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
            out.entry(r.partition)
                .or_default()
                .push((r.offset, key, value));
        }
    }
    out
}
