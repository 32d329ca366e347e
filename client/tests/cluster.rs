//! Three controllers and three brokers on 127.0.0.1, all real processes.
//! Records acknowledged with acks=all survive the kill -9 of their leader:
//! the new leader, elected from the ISR, serves every one of them, and the
//! restarted broker catches up as a follower and rejoins the ISR; the new
//! leaders' latest offsets already cover every acknowledged record.
//! A topic created through one broker is forwarded to the controller, placed
//! over all brokers, and every broker then answers the same metadata; the
//! client produces to each partition's leader wherever it is. Kill -9 of a
//! broker gives each partition it led a new leader from its ISR with a higher
//! leader epoch; restarted, it registers again. Kill -9 of the Raft leader
//! controller: a new one is elected and a topic can be created within 10 s,
//! while produce keeps working throughout. A SIGSTOPped leader is fenced and
//! replaced; resumed, it learns it no longer leads and refuses writes for
//! those partitions instead of taking them as a zombie leader.
//!
//! `RINGLOG_FAILOVER_ROUNDS=N` repeats the broker kill/restart N times and
//! prints the median time to new leaders (default 1 round).

mod consume;
mod real_broker;
mod real_cluster;
mod real_quorum;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use client::{
    Acks, Admin, ClientConfig, Cluster, ClusterMetadata, Consumer, ConsumerConfig, Producer,
    ProducerConfig,
};
use real_cluster::Brokers;
use real_quorum::Quorum;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 6;
const SESSION_TIMEOUT_MS: u64 = 2_000;
const CORES: u16 = 1;

impl Drop for Brokers {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("broker logs at the failure:\n{}", self.logs());
        }
    }
}

/// (leader, leader epoch, isr) per partition.
type Leaders = BTreeMap<i32, (i32, i32, Vec<i32>)>;

/// (leader, leader epoch, isr) per partition of `topic`.
fn leaders(metadata: &ClusterMetadata, topic: &str) -> Leaders {
    metadata
        .topic(topic)
        .map(|t| {
            t.partitions
                .iter()
                .map(|p| (p.partition, (p.leader, p.leader_epoch, p.isr.clone())))
                .collect()
        })
        .unwrap_or_default()
}

async fn metadata_from(bootstrap: &str) -> Option<std::sync::Arc<ClusterMetadata>> {
    let config = ClientConfig {
        metadata_attempts_max: 1,
        ..ClientConfig::default()
    };
    let cluster = match Cluster::connect(bootstrap, config).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("metadata from {bootstrap}: {e}");
            return None;
        }
    };
    Some(cluster.metadata())
}

/// Produces one keyed record per partition with acks=1 and returns the offsets.
async fn produce_each(
    bootstrap: &str,
    topic: &str,
    tag: &str,
) -> Result<BTreeMap<i32, i64>, String> {
    let config = ProducerConfig {
        acks: Acks::Leader,
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(bootstrap, ClientConfig::default(), config)
        .await
        .expect("producer connects");
    let mut deliveries = Vec::new();
    for partition in 0..PARTITIONS {
        let record = client::ProducerRecord {
            topic: topic.into(),
            partition: Some(partition),
            key: Some(Bytes::from(format!("k{partition}"))),
            value: Some(Bytes::from(format!("{tag}-{partition}"))),
            ..Default::default()
        };
        deliveries.push(producer.enqueue(record).await.expect("enqueued"));
    }
    let mut offsets = BTreeMap::new();
    for delivery in deliveries {
        let (partition, offset) = delivery
            .await
            .map_err(|e| format!("{topic}: not delivered to the leader: {e}"))?;
        offsets.insert(partition, offset);
    }
    producer.close().await.unwrap();
    Ok(offsets)
}

/// Records produced with acks=all per failover round.
const ACKED_RECORDS: usize = 300;

/// Produces `count` keyed records with acks=all; returns the acknowledged
/// values per partition in offset order.
async fn produce_acked(bootstrap: &str, topic: &str, count: usize) -> BTreeMap<i32, Vec<String>> {
    let config = ProducerConfig {
        acks: Acks::All,
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(bootstrap, ClientConfig::default(), config)
        .await
        .expect("producer connects");
    let mut deliveries = Vec::new();
    for i in 0..count {
        let value = format!("{topic}-acked-{i}");
        let record = client::ProducerRecord {
            topic: topic.into(),
            key: Some(Bytes::from(format!("key-{}", i % 17))),
            value: Some(Bytes::from(value.clone())),
            ..Default::default()
        };
        deliveries.push((value, producer.enqueue(record).await.expect("enqueued")));
    }
    let mut by_offset: BTreeMap<i32, BTreeMap<i64, String>> = BTreeMap::new();
    for (value, delivery) in deliveries {
        let (partition, offset) = delivery.await.expect("acknowledged by the ISR");
        by_offset
            .entry(partition)
            .or_default()
            .insert(offset, value);
    }
    producer.close().await.unwrap();
    by_offset
        .into_iter()
        .map(|(p, values)| (p, values.into_values().collect()))
        .collect()
}

/// Creates `topic` (all partitions, replication factor 3) through the broker
/// at `bootstrap` and returns its placement as that broker then sees it.
async fn create_topic(bootstrap: &str, topic: &str, configs: &[(String, String)]) -> Leaders {
    let admin = Admin::connect(bootstrap, ClientConfig::default())
        .await
        .unwrap();
    // A broker just restarted or resumed is unfenced a moment after it
    // caught up; until then three replicas cannot be placed.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match admin.create_topic(topic, PARTITIONS, 3, configs).await {
            Ok(()) => break,
            Err(client::ClientError::Broker {
                code: protocol::ErrorCode::InvalidReplicationFactor,
                ..
            }) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("create {topic}: {e}"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(metadata) = metadata_from(bootstrap).await {
            return leaders(&metadata, topic);
        }
        assert!(Instant::now() < deadline, "no metadata from {bootstrap}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the metadata `bootstrap` answers for `topic` until `done` holds and
/// returns it; after `within`, panics with `failure` of the last answer.
async fn await_leaders(
    bootstrap: &str,
    topic: &str,
    within: Duration,
    done: impl Fn(&Leaders) -> bool,
    failure: impl Fn(&Leaders) -> String,
) -> Leaders {
    let deadline = Instant::now() + within;
    loop {
        let now = metadata_from(bootstrap)
            .await
            .map(|m| leaders(&m, topic))
            .unwrap_or_default();
        if done(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "{}", failure(&now));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn median(mut values: Vec<u128>) -> u128 {
    values.sort();
    values[values.len() / 2]
}

#[test]
fn three_controllers_three_brokers_fail_over() {
    let root = tempfile::tempdir().unwrap();
    let session = SESSION_TIMEOUT_MS.to_string();
    let mut quorum = Quorum::start(&["--session-timeout-ms", &session]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(quorum.leader(Duration::from_secs(20)));
    let mut brokers = Brokers::start(root.path(), quorum.controller_list(), CORES);

    // Topic admin through broker 1 is forwarded to the controller leader.
    runtime.block_on(async {
        let admin = Admin::connect(&brokers.bootstrap(1), ClientConfig::default())
            .await
            .unwrap();
        admin
            .create_topic(TOPIC, PARTITIONS, 3, &[])
            .await
            .unwrap_or_else(|e| panic!("create: {e}\n{}", brokers.logs()));
    });

    // Every broker answers the same placement: three replicas each, a leader
    // per partition, leadership spread over all three brokers.
    let placement = runtime.block_on(async {
        let mut seen = Vec::new();
        for id in 1..=3 {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let metadata = metadata_from(&brokers.bootstrap(id)).await;
                let view = metadata.as_deref().map(|m| leaders(m, TOPIC));
                if let Some(view) = view.as_ref().filter(|v| v.len() == PARTITIONS as usize) {
                    seen.push(view.clone());
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "broker {id} never showed {TOPIC}: {view:?}\n{}",
                    brokers.logs()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "brokers agree: {seen:?}"
        );
        seen.remove(0)
    });
    let mut led_by: BTreeMap<i32, usize> = BTreeMap::new();
    for (leader, epoch, isr) in placement.values() {
        assert!(*leader >= 1 && *epoch >= 0, "{placement:?}");
        assert_eq!(isr.len(), 3, "{placement:?}");
        *led_by.entry(*leader).or_default() += 1;
    }
    assert_eq!(led_by.len(), 3, "every broker leads some: {placement:?}");

    // The client finds each partition's leader, wherever it is.
    let _placement = placement;
    let first = runtime
        .block_on(produce_each(&brokers.bootstrap(1), TOPIC, "before"))
        .unwrap_or_else(|e| panic!("{e}\n{}", brokers.logs()));
    assert_eq!(first.len(), PARTITIONS as usize);

    let rounds: usize = std::env::var("RINGLOG_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut failover_ms = Vec::new();
    for round in 0..rounds {
        // A fresh topic per round, written with acks=all before the kill.
        let topic = format!("{TOPIC}-{round}");
        let (before, acked) = runtime.block_on(async {
            let configs = [("min.insync.replicas".to_owned(), "2".to_owned())];
            let placement = create_topic(&brokers.bootstrap(1), &topic, &configs).await;
            let acked = produce_acked(&brokers.bootstrap(1), &topic, ACKED_RECORDS).await;
            (placement, acked)
        });
        // Kill -9 a broker that leads something.
        let victim = before[&0].0 as u32;
        let witness = if victim == 1 { 2 } else { 1 };
        let led: Vec<i32> = before
            .iter()
            .filter(|(_, (l, _, _))| *l == victim as i32)
            .map(|(p, _)| *p)
            .collect();
        brokers.kill9(victim);
        let killed_at = Instant::now();
        let after = runtime.block_on(await_leaders(
            &brokers.bootstrap(witness),
            &topic,
            Duration::from_millis(SESSION_TIMEOUT_MS + 8_000),
            |now| {
                led.iter().all(|p| {
                    now.get(p).is_some_and(|(leader, epoch, _)| {
                        let (_, old_epoch, old_isr) = &before[p];
                        *leader != victim as i32
                            && *leader >= 1
                            && old_isr.contains(leader)
                            && epoch > old_epoch
                    })
                })
            },
            |now| {
                format!(
                    "round {round}: partitions {led:?} of broker {victim} got no new leader: {now:?}\n{}",
                    brokers.logs()
                )
            },
        ));
        let elapsed = killed_at.elapsed().as_millis();
        failover_ms.push(elapsed);
        eprintln!(
            "round {round}: broker {victim} killed; its {} partitions had new leaders after {elapsed} ms",
            led.len()
        );
        for (p, (leader, _, isr)) in &after {
            assert_ne!(*leader, victim as i32, "partition {p}");
            assert!(
                !isr.contains(&(victim as i32)),
                "fenced broker left the ISR of {p}"
            );
        }
        // A new leader's latest offset covers every acknowledged record:
        // it answers OFFSET_NOT_AVAILABLE (retried by the client) until its
        // high watermark reaches its epoch's start, never a smaller end.
        runtime.block_on(async {
            let consumer = Consumer::connect(
                &brokers.bootstrap(witness),
                ClientConfig::default(),
                ConsumerConfig::default(),
            )
            .await
            .unwrap();
            let partitions: Vec<i32> = acked.keys().copied().collect();
            let ends = consumer
                .end_offsets(&topic, &partitions)
                .await
                .unwrap_or_else(|e| panic!("end offsets after the failover: {e}"));
            for (p, values) in &acked {
                assert!(
                    ends[p] >= values.len() as i64,
                    "round {round}: partition {p} ends at {} after the failover, below its {} acknowledged records",
                    ends[p],
                    values.len()
                );
            }
        });
        // Every acknowledged record is on the new leaders, in order.
        runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let read = consume::consume_all(&brokers.bootstrap(witness), &topic).await;
                let read: BTreeMap<i32, Vec<String>> = read
                    .into_iter()
                    .map(|(p, records)| (p, records.into_iter().map(|r| r.2).collect()))
                    .collect();
                if read == acked {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "acknowledged records lost or reordered after the failover:\nacked {acked:?}\nread {read:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        // Produce still reaches every partition, now on the survivors.
        let offsets = runtime
            .block_on(produce_each(&brokers.bootstrap(witness), &topic, "during"))
            .unwrap_or_else(|e| panic!("{e}\n{}", brokers.logs()));
        assert_eq!(offsets.len(), PARTITIONS as usize);

        // Restarted, it registers again and is a live broker in the metadata.
        let old_epoch = runtime
            .block_on(quorum.describe())
            .and_then(|d| d.brokers.into_iter().find(|b| b.id == victim))
            .map(|b| b.epoch)
            .unwrap();
        brokers.restart(victim);
        runtime.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let back = quorum
                    .describe()
                    .await
                    .and_then(|d| d.brokers.into_iter().find(|b| b.id == victim))
                    .is_some_and(|b| !b.fenced && b.epoch > old_epoch);
                let listed = metadata_from(&brokers.bootstrap(witness))
                    .await
                    .is_some_and(|m| m.broker(victim as i32).is_some());
                if back && listed {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "broker {victim} not registered again"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        // It catches up as a follower and its leaders put it back in the ISR.
        runtime.block_on(await_leaders(
            &brokers.bootstrap(witness),
            &topic,
            Duration::from_secs(20),
            |now| {
                now.len() == PARTITIONS as usize && now.values().all(|(_, _, isr)| isr.len() == 3)
            },
            |now| {
                format!(
                    "broker {victim} did not rejoin the ISR: {now:?}\n{}",
                    brokers.logs()
                )
            },
        ));
    }
    if rounds > 1 {
        eprintln!(
            "broker kill -9 to new leaders: median {} ms over {rounds} rounds ({failover_ms:?}), session timeout {SESSION_TIMEOUT_MS} ms",
            median(failover_ms.clone())
        );
    }

    // SIGTERM a leader: controlled shutdown. By the time the process has
    // exited, the controller has fenced it and its partitions lead elsewhere,
    // without waiting for its session to expire.
    let topic = format!("{TOPIC}-stopped");
    let before = runtime.block_on(create_topic(&brokers.bootstrap(1), &topic, &[]));
    let stopped = before[&0].0 as u32;
    let witness = if stopped == 1 { 2 } else { 1 };
    let old_epoch = runtime
        .block_on(quorum.describe())
        .and_then(|d| d.brokers.into_iter().find(|b| b.id == stopped))
        .map(|b| b.epoch)
        .unwrap();
    let stop_started = Instant::now();
    brokers.stop(stopped);
    eprintln!(
        "broker {stopped} stopped (controlled shutdown) in {} ms",
        stop_started.elapsed().as_millis()
    );
    let at_exit = runtime
        .block_on(quorum.describe())
        .and_then(|d| d.brokers.into_iter().find(|b| b.id == stopped))
        .unwrap();
    assert!(
        at_exit.fenced && at_exit.epoch == old_epoch,
        "fenced on its own request before it exited: {at_exit:?}"
    );
    assert_eq!(at_exit.partitions_led, 0, "{at_exit:?}");
    runtime.block_on(await_leaders(
        &brokers.bootstrap(witness),
        &topic,
        Duration::from_secs(5),
        |now| {
            now.len() == PARTITIONS as usize
                && now.iter().all(|(p, (leader, epoch, _))| {
                    before[p].0 != stopped as i32
                        || (*leader != stopped as i32 && *epoch > before[p].1)
                })
        },
        |now| format!("brokers never saw the hand-over: {now:?}"),
    ));
    brokers.restart(stopped);

    // SIGSTOP a leader: fenced and replaced like a dead one. On SIGCONT it
    // catches up with the metadata and refuses produce for what it lost.
    let topic = format!("{TOPIC}-paused");
    let before = runtime.block_on(create_topic(&brokers.bootstrap(1), &topic, &[]));
    let paused = before[&0].0 as u32;
    let witness = if paused == 1 { 2 } else { 1 };
    let lost: Vec<i32> = before
        .iter()
        .filter(|(_, (l, _, _))| *l == paused as i32)
        .map(|(p, _)| *p)
        .collect();
    brokers.signal(paused, "-STOP");
    let moved = |now: &Leaders| {
        lost.iter().all(|p| {
            now.get(p).is_some_and(|(leader, epoch, _)| {
                *leader != paused as i32 && *leader >= 1 && *epoch > before[p].1
            })
        })
    };
    runtime.block_on(await_leaders(
        &brokers.bootstrap(witness),
        &topic,
        Duration::from_millis(SESSION_TIMEOUT_MS + 8_000),
        moved,
        |now| format!("paused broker {paused} not replaced: {now:?}"),
    ));
    brokers.signal(paused, "-CONT");
    runtime.block_on(async {
        await_leaders(
            &brokers.bootstrap(paused),
            &topic,
            Duration::from_secs(20),
            moved,
            |own| {
                format!(
                    "resumed broker {paused} still sees {own:?}\n{}",
                    brokers.brokers[(paused - 1) as usize]
                        .as_ref()
                        .unwrap()
                        .log()
                )
            },
        )
        .await;
        // A produce sent straight to it for a partition it lost is refused.
        let mut builder = protocol::BatchBuilder::new(protocol::Compression::None);
        builder.push(&protocol::Record {
            timestamp_ms: 1,
            key: None,
            value: Some(b"zombie"),
            headers: &[],
        });
        let batch = builder.build().unwrap();
        let entry = client::messages::ProduceEntry {
            topic: &topic,
            partition: lost[0],
            batch: &batch,
        };
        let cluster = Cluster::connect(&brokers.bootstrap(paused), ClientConfig::default())
            .await
            .unwrap();
        let response = cluster
            .request_to(
                &brokers.bootstrap(paused),
                protocol::ApiKey::Produce,
                &client::messages::produce_request(1, 5_000, &[entry]),
                &[&batch],
            )
            .await
            .unwrap();
        let outcome = client::messages::produce_response(response.body()).unwrap();
        assert_eq!(
            outcome[0].error,
            protocol::ErrorCode::NotLeaderOrFollower,
            "{outcome:?}"
        );
    });

    // Kill -9 the Raft leader controller: the data plane keeps serving, and a
    // new controller leader takes topic creation within 10 s. The writes go
    // to a fresh topic with every partition led: the earlier phases may have
    // left some of `orders` offline until its last ISR member is back, which
    // is the point of unclean election being off.
    let topic = format!("{TOPIC}-controllerless");
    runtime.block_on(async {
        create_topic(&brokers.bootstrap(1), &topic, &[]).await;
        await_leaders(
            &brokers.bootstrap(1),
            &topic,
            Duration::from_secs(10),
            |now| now.len() == PARTITIONS as usize && now.values().all(|(l, _, _)| *l >= 1),
            |now| format!("{topic} not led: {now:?}"),
        )
        .await;
    });
    let leader = runtime.block_on(quorum.leader(Duration::from_secs(10)));
    quorum.kill9(leader);
    let killed_at = Instant::now();
    let offsets = runtime
        .block_on(produce_each(
            &brokers.bootstrap(1),
            &topic,
            "controllerless",
        ))
        .unwrap_or_else(|e| panic!("{e}\n{}", brokers.logs()));
    assert_eq!(offsets.len(), PARTITIONS as usize);
    runtime.block_on(async {
        let admin = Admin::connect(&brokers.bootstrap(1), ClientConfig::default())
            .await
            .unwrap();
        loop {
            match admin.create_topic("after-failover", 2, 2, &[]).await {
                Ok(()) => break,
                Err(e) => assert!(
                    killed_at.elapsed() < Duration::from_secs(10),
                    "no topic created within 10 s of the controller leader's death: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let new_leader = quorum.leader(Duration::from_secs(5)).await;
        assert_ne!(new_leader, leader);
        eprintln!(
            "controller {leader} killed; topic created via controller {new_leader} after {} ms",
            killed_at.elapsed().as_millis()
        );
        // Broker 2 follows the new controller leader too, a moment later.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let count = metadata_from(&brokers.bootstrap(2))
                .await
                .and_then(|m| m.topic("after-failover").map(|t| t.partition_count()));
            if count == Some(2) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "broker 2 never showed after-failover: {count:?}\n{}",
                brokers.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}
