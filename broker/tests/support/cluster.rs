//! Starting the real `ringlog-broker` binary on 127.0.0.1 for multi-process
//! tests, and a blocking wire client that speaks the protocol with raw frames.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use protocol::flatbuffers::FlatBufferBuilder;
use protocol::frame::{decode_response, encode_request, RequestHeader};
use protocol::{wire, ApiKey, ErrorCode};

// The client's end-to-end helpers own the port choice; shared by path so
// every multi-process test picks ports the same way.
#[path = "../../../client/tests/real_broker/mod.rs"]
mod real_broker;
pub use real_broker::free_port_block;

#[derive(Debug)]
pub struct Broker {
    pub child: Option<Child>,
    pub data_dir: PathBuf,
    pub port: u16,
    pub cores: usize,
    pub log_path: PathBuf,
}

impl Broker {
    pub fn start(data_dir: &Path, cores: usize) -> Broker {
        let port = free_port_block(cores as u16);
        Broker::start_on(data_dir, cores, port)
    }

    pub fn start_on(data_dir: &Path, cores: usize, port: u16) -> Broker {
        Broker::start_with(data_dir, cores, port, &[])
    }

    /// Starts with extra flags, e.g. `--config FILE`.
    pub fn start_with(data_dir: &Path, cores: usize, port: u16, extra: &[&str]) -> Broker {
        let log_path = data_dir.with_extension(format!("broker-{port}.log"));
        Broker::start_logging_to(data_dir, cores, port, extra, &log_path)
    }

    /// Starts with standard error going to `log_path` (`/dev/full` makes every
    /// log write fail with ENOSPC).
    pub fn start_logging_to(
        data_dir: &Path,
        cores: usize,
        port: u16,
        extra: &[&str],
        log_path: &Path,
    ) -> Broker {
        let command = Command::new(env!("CARGO_BIN_EXE_ringlog-broker"));
        Broker::launch(command, data_dir, cores, port, extra, log_path)
    }

    /// Starts under `taskset -c CPUS`: the process may run on those only.
    pub fn start_on_cpus(data_dir: &Path, cores: usize, cpus: &str) -> Broker {
        let port = free_port_block(cores as u16);
        let mut command = Command::new("taskset");
        command
            .args(["-c", cpus])
            .arg(env!("CARGO_BIN_EXE_ringlog-broker"));
        let log_path = data_dir.with_extension(format!("broker-{port}.log"));
        Broker::launch(command, data_dir, cores, port, &[], &log_path)
    }

    fn launch(
        mut command: Command,
        data_dir: &Path,
        cores: usize,
        port: u16,
        extra: &[&str],
        log_path: &Path,
    ) -> Broker {
        let log_path = log_path.to_path_buf();
        let log = std::fs::File::create(&log_path).unwrap();
        let child = command
            .args([
                "--node-id",
                "1",
                "--cores",
                &cores.to_string(),
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("broker starts");
        let broker = Broker {
            child: Some(child),
            data_dir: data_dir.to_path_buf(),
            port,
            cores,
            log_path,
        };
        broker.wait_ready();
        broker
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn shard_addr(&self, shard: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port + 1 + shard))
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let ready = (0..self.cores as u16)
                .all(|s| TcpStream::connect(self.shard_addr(s)).is_ok())
                && TcpStream::connect(self.addr()).is_ok();
            if ready {
                if let Ok(mut client) = Client::connect(self.addr()) {
                    if client.api_versions().is_ok() {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("broker not ready; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        if self.log_path.starts_with("/dev") {
            return String::new();
        }
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// SIGTERM and wait: the graceful path. Returns the exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("broker did not stop on SIGTERM; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9: the crash path.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A blocking client that speaks raw frames.
#[derive(Debug)]
pub struct Client {
    pub stream: TcpStream,
    next_id: u32,
}

pub struct Response {
    pub body: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Client { stream, next_id: 1 })
    }

    pub fn send(&mut self, api: ApiKey, body: &[u8], payload: &[&[u8]]) -> std::io::Result<u32> {
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = Vec::new();
        encode_request(
            &mut frame,
            &RequestHeader {
                api_key: api as u16,
                api_version: 0,
                correlation_id: id,
                client_id: "test".into(),
            },
            body,
            payload,
        );
        self.stream.write_all(&frame)?;
        Ok(id)
    }

    pub fn receive(&mut self) -> std::io::Result<(u32, Response)> {
        let mut prefix = [0u8; 4];
        self.stream.read_exact(&mut prefix)?;
        let mut frame = vec![0u8; u32::from_be_bytes(prefix) as usize];
        self.stream.read_exact(&mut frame)?;
        let decoded = decode_response(&frame).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok((
            decoded.correlation_id,
            Response {
                body: decoded.body.to_vec(),
                payload: decoded.payload.to_vec(),
            },
        ))
    }

    pub fn call(
        &mut self,
        api: ApiKey,
        body: &[u8],
        payload: &[&[u8]],
    ) -> std::io::Result<Response> {
        let id = self.send(api, body, payload)?;
        let (got, response) = self.receive()?;
        assert_eq!(got, id, "responses in request order");
        Ok(response)
    }

    pub fn api_versions(&mut self) -> std::io::Result<ErrorCode> {
        let mut fbb = FlatBufferBuilder::new();
        let root = wire::ApiVersionsRequest::create(&mut fbb, &wire::ApiVersionsRequestArgs {});
        fbb.finish_minimal(root);
        let response = self.call(ApiKey::ApiVersions, fbb.finished_data(), &[])?;
        let parsed = protocol::flatbuffers::root::<wire::ApiVersionsResponse>(&response.body)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(ErrorCode::from_u16(parsed.error_code()))
    }

    pub fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> ErrorCode {
        let mut fbb = FlatBufferBuilder::new();
        let entries: Vec<_> = configs
            .iter()
            .map(|(k, v)| {
                let (key, value) = (fbb.create_string(k), fbb.create_string(v));
                wire::ConfigEntry::create(
                    &mut fbb,
                    &wire::ConfigEntryArgs {
                        key: Some(key),
                        value: Some(value),
                    },
                )
            })
            .collect();
        let entries = fbb.create_vector(&entries);
        let fb_name = fbb.create_string(name);
        let topic = wire::CreateTopic::create(
            &mut fbb,
            &wire::CreateTopicArgs {
                name: Some(fb_name),
                partitions,
                replication_factor: 1,
                configs: Some(entries),
            },
        );
        let topics = fbb.create_vector(&[topic]);
        let root = wire::CreateTopicsRequest::create(
            &mut fbb,
            &wire::CreateTopicsRequestArgs {
                topics: Some(topics),
            },
        );
        fbb.finish_minimal(root);
        let response = self
            .call(ApiKey::CreateTopics, fbb.finished_data(), &[])
            .unwrap();
        let parsed =
            protocol::flatbuffers::root::<wire::CreateTopicsResponse>(&response.body).unwrap();
        ErrorCode::from_u16(parsed.results().unwrap().get(0).error_code())
    }

    pub fn produce_body(topic: &str, partition: i32, batch_len: usize, acks: i16) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::new();
        let range = wire::ByteRange::new(0, batch_len as u32);
        let p = wire::ProducePartition::create(
            &mut fbb,
            &wire::ProducePartitionArgs {
                partition,
                records: Some(&range),
            },
        );
        let partitions = fbb.create_vector(&[p]);
        let name = fbb.create_string(topic);
        let t = wire::ProduceTopic::create(
            &mut fbb,
            &wire::ProduceTopicArgs {
                name: Some(name),
                partitions: Some(partitions),
            },
        );
        let topics = fbb.create_vector(&[t]);
        let root = wire::ProduceRequest::create(
            &mut fbb,
            &wire::ProduceRequestArgs {
                acks,
                timeout_ms: 30_000,
                topics: Some(topics),
            },
        );
        fbb.finish_minimal(root);
        fbb.finished_data().to_vec()
    }

    /// Produces one batch; returns the error code and base offset.
    pub fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        batch: &[u8],
        acks: i16,
    ) -> (ErrorCode, i64) {
        let body = Client::produce_body(topic, partition, batch.len(), acks);
        let response = self.call(ApiKey::Produce, &body, &[batch]).unwrap();
        let parsed = protocol::flatbuffers::root::<wire::ProduceResponse>(&response.body).unwrap();
        let result = parsed.topics().unwrap().get(0).partitions().unwrap().get(0);
        (
            ErrorCode::from_u16(result.error_code()),
            result.base_offset(),
        )
    }

    /// Fetches one partition; returns error code, high watermark, log start, records.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        max_wait_ms: i32,
    ) -> (ErrorCode, i64, i64, Vec<u8>) {
        let mut fbb = FlatBufferBuilder::new();
        let p = wire::FetchPartition::create(
            &mut fbb,
            &wire::FetchPartitionArgs {
                partition,
                fetch_offset: offset,
                max_bytes,
                current_leader_epoch: -1,
                last_fetched_epoch: -1,
            },
        );
        let partitions = fbb.create_vector(&[p]);
        let name = fbb.create_string(topic);
        let t = wire::FetchTopic::create(
            &mut fbb,
            &wire::FetchTopicArgs {
                name: Some(name),
                partitions: Some(partitions),
            },
        );
        let topics = fbb.create_vector(&[t]);
        let root = wire::FetchRequest::create(
            &mut fbb,
            &wire::FetchRequestArgs {
                replica_id: -1,
                replica_epoch: -1,
                max_wait_ms,
                min_bytes: 1,
                max_bytes: 64 << 20,
                topics: Some(topics),
                isolation_level: 0,
            },
        );
        fbb.finish_minimal(root);
        let response = self.call(ApiKey::Fetch, fbb.finished_data(), &[]).unwrap();
        let parsed = protocol::flatbuffers::root::<wire::FetchResponse>(&response.body).unwrap();
        let result = parsed.topics().unwrap().get(0).partitions().unwrap().get(0);
        let range = result.records().unwrap();
        let records = response.payload
            [range.offset() as usize..(range.offset() + range.length()) as usize]
            .to_vec();
        (
            ErrorCode::from_u16(result.error_code()),
            result.high_watermark(),
            result.log_start_offset(),
            records,
        )
    }

    /// Sends (without waiting for the answer) one fetch over `partitions`
    /// (partition, offset) of `topic`; returns the correlation id.
    pub fn send_fetch_many(
        &mut self,
        topic: &str,
        partitions: &[(i32, i64)],
        max_wait_ms: i32,
        response_bytes_max: i32,
    ) -> u32 {
        let mut fbb = FlatBufferBuilder::new();
        let entries: Vec<_> = partitions
            .iter()
            .map(|&(partition, offset)| {
                wire::FetchPartition::create(
                    &mut fbb,
                    &wire::FetchPartitionArgs {
                        partition,
                        fetch_offset: offset,
                        max_bytes: 1 << 20,
                        current_leader_epoch: -1,
                        last_fetched_epoch: -1,
                    },
                )
            })
            .collect();
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string(topic);
        let t = wire::FetchTopic::create(
            &mut fbb,
            &wire::FetchTopicArgs {
                name: Some(name),
                partitions: Some(entries),
            },
        );
        let topics = fbb.create_vector(&[t]);
        let root = wire::FetchRequest::create(
            &mut fbb,
            &wire::FetchRequestArgs {
                replica_id: -1,
                replica_epoch: -1,
                max_wait_ms,
                min_bytes: 1,
                max_bytes: response_bytes_max,
                topics: Some(topics),
                isolation_level: 0,
            },
        );
        fbb.finish_minimal(root);
        self.send(ApiKey::Fetch, fbb.finished_data(), &[]).unwrap()
    }

    pub fn list_offset(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> (ErrorCode, i64) {
        let mut fbb = FlatBufferBuilder::new();
        let p = wire::ListOffsetsPartition::create(
            &mut fbb,
            &wire::ListOffsetsPartitionArgs {
                partition,
                timestamp_ms,
            },
        );
        let partitions = fbb.create_vector(&[p]);
        let name = fbb.create_string(topic);
        let t = wire::ListOffsetsTopic::create(
            &mut fbb,
            &wire::ListOffsetsTopicArgs {
                name: Some(name),
                partitions: Some(partitions),
            },
        );
        let topics = fbb.create_vector(&[t]);
        let root = wire::ListOffsetsRequest::create(
            &mut fbb,
            &wire::ListOffsetsRequestArgs {
                topics: Some(topics),
                isolation_level: 0,
            },
        );
        fbb.finish_minimal(root);
        let response = self
            .call(ApiKey::ListOffsets, fbb.finished_data(), &[])
            .unwrap();
        let parsed =
            protocol::flatbuffers::root::<wire::ListOffsetsResponse>(&response.body).unwrap();
        let result = parsed.topics().unwrap().get(0).partitions().unwrap().get(0);
        (ErrorCode::from_u16(result.error_code()), result.offset())
    }

    /// (topic name, partition, owning shard) for every partition of `topic`.
    pub fn partition_shards(&mut self, topic: &str) -> Vec<(i32, u16)> {
        let mut fbb = FlatBufferBuilder::new();
        let name = fbb.create_string(topic);
        let topics = fbb.create_vector(&[name]);
        let root = wire::MetadataRequest::create(
            &mut fbb,
            &wire::MetadataRequestArgs {
                topics: Some(topics),
            },
        );
        fbb.finish_minimal(root);
        let response = self
            .call(ApiKey::Metadata, fbb.finished_data(), &[])
            .unwrap();
        let parsed = protocol::flatbuffers::root::<wire::MetadataResponse>(&response.body).unwrap();
        parsed
            .topics()
            .unwrap()
            .get(0)
            .partitions()
            .map(|ps| ps.iter().map(|p| (p.partition(), p.shard())).collect())
            .unwrap_or_default()
    }
}
