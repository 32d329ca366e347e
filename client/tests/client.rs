//! End-to-end tests of the client library against the in-process fake
//! broker (`fake_broker`): connection pipelining, producer delivery, acks=0,
//! retries, shard routing and the consumer's offset handling. One test
//! binary for the crate.

mod fake_broker;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::partitioner::partition_for_key;
use client::{
    messages, Acks, ClientConfig, ClientError, Cluster, Connection, Consumer, ConsumerConfig,
    Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use fake_broker::FakeBroker;
use protocol::{ApiKey, BatchBuilder, Compression, ErrorCode, Record};

/// Bound on how long a test waits for a condition it polls for.
const DEADLINE: Duration = Duration::from_secs(10);

/// Polls `condition` until it holds or `DEADLINE` passes.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("finished within the test deadline")
}

fn describe_name(response: &client::Response) -> String {
    messages::describe_topic_response(response.body())
        .unwrap()
        .name
}

#[tokio::test]
async fn connection_pipelines_requests_and_matches_responses_by_correlation_id() {
    // Proves many requests are in flight on one connection at once (the fake
    // answers none until it has read 16) and that responses written in
    // reverse order still reach the request that asked, by correlation id.
    let broker = FakeBroker::start(&[], 1).await;
    broker.state.lock().unwrap().hold_describe_responses = 16;
    let connection = Connection::connect(&broker.bootstrap(), &ClientConfig::default())
        .await
        .unwrap();
    let mut futures = Vec::new();
    for i in 0..16 {
        let body = messages::describe_topic_request(&format!("echo-{i}"));
        futures.push(
            connection
                .send(ApiKey::DescribeTopic, &body, &[])
                .await
                .unwrap(),
        );
    }
    for (i, future) in futures.into_iter().enumerate() {
        let response = within(future).await.unwrap();
        assert_eq!(describe_name(&response), format!("echo-{i}"));
    }
    assert_eq!(broker.state.lock().unwrap().held_requests_max, 16);
    assert_eq!(connection.in_flight_requests(), 0);
}

#[tokio::test]
async fn connection_bounds_in_flight_requests_and_fails_cleanly_on_close() {
    // Proves a sender waits for a slot once in_flight_requests_max requests
    // are unanswered, and that a peer closing the socket fails every pending
    // request with ConnectionClosed instead of hanging.
    let broker = FakeBroker::start(&[], 1).await;
    broker.state.lock().unwrap().hold_describe_responses = 100;
    let config = ClientConfig {
        in_flight_requests_max: 2,
        ..ClientConfig::default()
    };
    let connection = Connection::connect(&broker.bootstrap(), &config)
        .await
        .unwrap();
    let body = messages::describe_topic_request("held");
    let first = connection
        .send(ApiKey::DescribeTopic, &body, &[])
        .await
        .unwrap();
    let second = connection
        .send(ApiKey::DescribeTopic, &body, &[])
        .await
        .unwrap();
    assert_eq!(connection.in_flight_requests(), 2);
    let third = tokio::time::timeout(
        Duration::from_millis(50),
        connection.send(ApiKey::DescribeTopic, &body, &[]),
    )
    .await;
    assert!(third.is_err(), "a third request must wait for a slot");
    drop(third);
    // A peer that closes the socket fails its pending request at once.
    let closer = Connection::connect(&broker.bootstrap(), &ClientConfig::default())
        .await
        .unwrap();
    let close_body = messages::describe_topic_request("close-connection");
    let closed = within(closer.request(ApiKey::DescribeTopic, &close_body, &[])).await;
    assert!(
        matches!(closed, Err(ClientError::ConnectionClosed { .. })),
        "{closed:?}"
    );
    assert!(closer.is_closed());
    // Dropping the last handle fails what is still pending on it.
    drop(connection);
    for pending in [first, second] {
        assert!(within(pending).await.is_err());
    }
}

async fn producer(broker: &FakeBroker, config: ProducerConfig) -> Producer {
    let cluster = Cluster::connect(&broker.bootstrap(), ClientConfig::default())
        .await
        .unwrap();
    Producer::new(cluster, config).unwrap()
}

#[tokio::test]
async fn producer_futures_resolve_to_partition_and_offset_over_shard_routes() {
    // Proves each record's future resolves to the partition its key hashes
    // to and to its own dense offset, in enqueue order per partition, and
    // that every partition's batches went to its leader's shard listener.
    let broker = FakeBroker::start(&[("t", 4)], 2).await;
    let producer = producer(&broker, ProducerConfig::default()).await;
    let mut deliveries = Vec::new();
    for i in 0..200 {
        let key = format!("k{}", i % 17);
        let record = ProducerRecord {
            topic: "t".into(),
            key: Some(Bytes::from(key.clone())),
            value: Some(Bytes::from(format!("v{i}"))),
            ..ProducerRecord::default()
        };
        deliveries.push((key, i, producer.enqueue(record).await.unwrap()));
    }
    let mut next_offset = BTreeMap::new();
    for (key, i, delivery) in deliveries {
        let (partition, offset) = within(delivery).await.unwrap();
        assert_eq!(partition, partition_for_key(key.as_bytes(), 4));
        let expected = next_offset.entry(partition).or_insert(0i64);
        assert_eq!(offset, *expected, "dense offsets in enqueue order");
        *expected += 1;
        let stored = broker.records("t", partition);
        assert_eq!(stored[offset as usize].2, format!("v{i}").into_bytes());
    }
    let routes = broker.state.lock().unwrap().produce_routes.clone();
    assert!(!routes.is_empty());
    for (listener, partition) in routes {
        assert_eq!(
            listener,
            partition as usize % 2,
            "partition {partition} routed to its shard"
        );
    }
    // `send` is the one-call form: a future of (partition, offset).
    let (partition, offset) =
        within(producer.send("t", Some(Bytes::from_static(b"k0")), None, vec![]))
            .await
            .unwrap();
    assert_eq!(partition, partition_for_key(b"k0", 4));
    assert_eq!(offset, next_offset[&partition]);
    producer.close().await.unwrap();
    assert!(matches!(
        producer.send("t", None, None, vec![]).await,
        Err(ClientError::ProducerClosed)
    ));
}

#[tokio::test]
async fn null_keys_spread_over_all_partitions() {
    // Proves unkeyed records are not all sent to one partition: with small
    // batches the sticky partition rotates over every partition.
    let broker = FakeBroker::start(&[("t", 3)], 1).await;
    let config = ProducerConfig {
        batch_bytes_max: 1024,
        ..ProducerConfig::default()
    };
    let producer = producer(&broker, config).await;
    let mut deliveries = Vec::new();
    for _ in 0..300 {
        let record = ProducerRecord {
            topic: "t".into(),
            value: Some(Bytes::from_static(&[b'x'; 100])),
            ..ProducerRecord::default()
        };
        deliveries.push(producer.enqueue(record).await.unwrap());
    }
    let mut per_partition = [0usize; 3];
    for delivery in deliveries {
        per_partition[within(delivery).await.unwrap().0 as usize] += 1;
    }
    assert!(per_partition.iter().all(|n| *n > 0), "{per_partition:?}");
}

#[tokio::test]
async fn acks_zero_resolves_without_waiting_for_a_response() {
    // Proves acks=0 futures resolve once the request is written (offset -1)
    // although the broker never answers, and the records do arrive.
    let broker = FakeBroker::start(&[("t", 2)], 1).await;
    let config = ProducerConfig {
        acks: Acks::None,
        ..ProducerConfig::default()
    };
    let producer = producer(&broker, config).await;
    let mut deliveries = Vec::new();
    for i in 0..10 {
        let key = Bytes::from(format!("k{i}"));
        deliveries.push(producer.send("t", Some(key), Some(Bytes::from_static(b"v")), vec![]));
    }
    for result in within(async {
        let mut results = Vec::new();
        for d in deliveries {
            results.push(d.await);
        }
        results
    })
    .await
    {
        let (_, offset) = result.unwrap();
        assert_eq!(offset, -1);
    }
    within(producer.flush()).await.unwrap();
    eventually("the fake stored all 10 records", || {
        broker.total_records() == 10
    })
    .await;
}

#[tokio::test]
async fn producer_retries_retriable_errors_then_gives_up() {
    // Proves a retriable error (NOT_LEADER_OR_FOLLOWER) is retried with a
    // metadata refresh until it succeeds, and that after retries_max
    // retries the record fails with the broker's code.
    let broker = FakeBroker::start(&[("t", 1)], 1).await;
    broker.state.lock().unwrap().produce_failures_remaining = 2;
    let config = ProducerConfig {
        retries_max: 3,
        retry_backoff_ms: 1,
        ..ProducerConfig::default()
    };
    let producer = producer(&broker, config.clone()).await;
    let metadata_before = broker.state.lock().unwrap().metadata_requests;
    let delivery = within(producer.send("t", None, Some(Bytes::from_static(b"v")), vec![])).await;
    assert_eq!(delivery.unwrap(), (0, 0));
    {
        let state = broker.state.lock().unwrap();
        assert_eq!(state.produce_requests, 3);
        assert!(
            state.metadata_requests >= metadata_before + 2,
            "refreshed on NOT_LEADER"
        );
    }
    broker.state.lock().unwrap().produce_failures_remaining = 10;
    let failed = within(producer.send("t", None, Some(Bytes::from_static(b"v")), vec![])).await;
    assert!(
        matches!(
            failed,
            Err(ClientError::Broker {
                code: ErrorCode::NotLeaderOrFollower,
                ..
            })
        ),
        "{failed:?}"
    );
    assert_eq!(
        broker.state.lock().unwrap().produce_requests,
        3 + 1 + config.retries_max
    );
    assert_eq!(broker.records("t", 0).len(), 1);
}

fn store_batch(broker: &FakeBroker, values: &[&str], timestamp_ms: i64) {
    let mut builder = BatchBuilder::new(Compression::None);
    for value in values {
        builder.push(&Record {
            timestamp_ms,
            key: None,
            value: Some(value.as_bytes()),
            headers: &[],
        });
    }
    let batch = builder.build().unwrap();
    let mut state = broker.state.lock().unwrap();
    state
        .partitions
        .get_mut(&("t".to_string(), 0))
        .unwrap()
        .append(&batch);
}

async fn poll_until(consumer: &mut Consumer, count: usize) -> Vec<client::ConsumerRecord> {
    let deadline = Instant::now() + DEADLINE;
    let mut records = Vec::new();
    while records.len() < count {
        assert!(
            Instant::now() < deadline,
            "timed out polling for {count} records"
        );
        records.extend(consumer.poll(Duration::from_millis(100)).await.unwrap());
    }
    records
}

#[tokio::test]
async fn consumer_skips_records_below_the_requested_offset() {
    // Proves that when the fetched batch starts before the requested offset
    // the consumer returns only records at or after it, that positions, end
    // offsets and timestamp seeks agree with the log, and seeking back rereads.
    let broker = FakeBroker::start(&[("t", 1)], 1).await;
    store_batch(&broker, &["a", "b", "c", "d", "e"], 1_000);
    store_batch(&broker, &["f", "g", "h", "i", "j"], 2_000);
    let cluster = Cluster::connect(&broker.bootstrap(), ClientConfig::default())
        .await
        .unwrap();
    let mut consumer = Consumer::new(cluster, ConsumerConfig::default()).unwrap();
    assert_eq!(consumer.assign("t", None).await.unwrap(), vec![0]);
    assert_eq!(consumer.end_offsets("t", &[0]).await.unwrap()[&0], 10);
    assert_eq!(consumer.seek("t", 0, SeekTo::Offset(3)).await.unwrap(), 3);
    let records = poll_until(&mut consumer, 7).await;
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (3..10).collect::<Vec<_>>());
    assert_eq!(records[0].value.as_deref(), Some(&b"d"[..]));
    assert_eq!(consumer.position("t", 0), Some(10));
    assert_eq!(
        consumer
            .seek("t", 0, SeekTo::Timestamp(1_500))
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        consumer
            .seek("t", 0, SeekTo::Timestamp(9_999))
            .await
            .unwrap(),
        10
    );
    assert_eq!(consumer.seek("t", 0, SeekTo::Latest).await.unwrap(), 10);
    assert_eq!(consumer.seek("t", 0, SeekTo::Earliest).await.unwrap(), 0);
    let again = poll_until(&mut consumer, 10).await;
    assert_eq!(again.len(), 10);
    assert_eq!(again[9].value.as_deref(), Some(&b"j"[..]));
    assert_eq!(again[9].timestamp_ms, 2_000);
}

#[tokio::test]
async fn consumer_resets_an_out_of_range_position() {
    // Proves OFFSET_OUT_OF_RANGE moves the position into the valid range the
    // broker reports (here to the log end) instead of failing or looping.
    let broker = FakeBroker::start(&[("t", 1)], 1).await;
    store_batch(&broker, &["a", "b"], 1);
    let cluster = Cluster::connect(&broker.bootstrap(), ClientConfig::default())
        .await
        .unwrap();
    let mut consumer = Consumer::new(cluster, ConsumerConfig::default()).unwrap();
    consumer.assign("t", Some(&[0])).await.unwrap();
    consumer.seek("t", 0, SeekTo::Offset(50)).await.unwrap();
    let deadline = Instant::now() + DEADLINE;
    while consumer.position("t", 0) != Some(2) {
        assert!(Instant::now() < deadline, "position never reset");
        assert!(consumer
            .poll(Duration::from_millis(20))
            .await
            .unwrap()
            .is_empty());
    }
    store_batch(&broker, &["c"], 1);
    let records = poll_until(&mut consumer, 1).await;
    assert_eq!(records[0].offset, 2);
}

#[tokio::test]
async fn a_request_of_shared_buffers_reaches_the_socket_whole_and_in_order() {
    // Batches go out in vectored writes straight from their buffers. A peer
    // that reads nothing for a while fills the socket, so the writes come
    // back short and must resume mid-buffer; a small request queued behind
    // must follow the large one, not interleave with it.
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let parts: Vec<Bytes> = (0..300u32)
        .map(|i| {
            let len = 1 + (i as usize * 7919) % 65_536;
            Bytes::from(
                (0..len)
                    .map(|j| (i as usize + j) as u8)
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    let expected: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let connection = Connection::connect(&address, &ClientConfig::default())
        .await
        .unwrap();
    let (mut socket, _) = listener.accept().await.unwrap();
    let sender = connection.clone();
    let sent = tokio::spawn(async move {
        sender
            .send_parts_without_response(ApiKey::Produce, b"large", parts)
            .await
            .unwrap();
        sender
            .send_without_response(ApiKey::ApiVersions, b"small", &[b"tail"])
            .await
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut frames = Vec::new();
    for _ in 0..2 {
        let mut prefix = [0u8; 4];
        within(socket.read_exact(&mut prefix)).await.unwrap();
        let mut frame = vec![0u8; u32::from_be_bytes(prefix) as usize];
        within(socket.read_exact(&mut frame)).await.unwrap();
        frames.push(frame);
    }
    within(sent).await.unwrap();
    let large = protocol::frame::decode_request(&frames[0]).unwrap();
    assert_eq!(large.header.api_key, ApiKey::Produce as u16);
    assert_eq!(large.body, b"large");
    assert_eq!(large.payload.len(), expected.len());
    assert!(large.payload == &expected[..], "payload bytes in order");
    let small = protocol::frame::decode_request(&frames[1]).unwrap();
    assert_eq!(
        (small.header.api_key, small.body, small.payload),
        (ApiKey::ApiVersions as u16, &b"small"[..], &b"tail"[..])
    );
}
