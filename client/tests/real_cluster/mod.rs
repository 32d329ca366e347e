//! Three real brokers (`ringlog-broker` processes) following a controller
//! quorum, for the multi-process tests: start, stop, kill -9, signal and
//! restart each one by id (1 to 3) on its own data directory and port; and
//! the `ringlog` CLI as a producer whose exit status says every record was
//! acknowledged.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::real_broker::{free_port_block, RealBroker};

/// The brokers, by id - 1; `None` while one is down.
pub struct Brokers {
    pub brokers: Vec<Option<RealBroker>>,
    ports: Vec<u16>,
    dirs: Vec<PathBuf>,
    controllers: String,
    cores: u16,
    extra: Vec<String>,
}

impl Brokers {
    pub fn start(root: &Path, controllers: String, cores: u16) -> Brokers {
        Brokers::start_with(root, controllers, cores, &[])
    }

    /// `start` with extra broker flags (such as `--config FILE`).
    pub fn start_with(root: &Path, controllers: String, cores: u16, extra: &[&str]) -> Brokers {
        let mut brokers = Brokers {
            brokers: Vec::new(),
            ports: Vec::new(),
            dirs: Vec::new(),
            controllers,
            cores,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        for id in 1..=3u32 {
            brokers.ports.push(free_port_block(cores));
            brokers.dirs.push(root.join(format!("b{id}")));
            brokers.brokers.push(None);
            brokers.restart(id);
        }
        brokers
    }

    pub fn restart(&mut self, id: u32) {
        let i = (id - 1) as usize;
        self.brokers[i] = Some(RealBroker::start_node(
            &self.dirs[i],
            self.ports[i],
            id,
            self.cores,
            &[
                &["--controller", self.controllers.as_str()][..],
                &self.extra.iter().map(String::as_str).collect::<Vec<_>>(),
            ]
            .concat(),
        ));
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self, id: u32) {
        if let Some(mut broker) = self.brokers[(id - 1) as usize].take() {
            broker.stop();
        }
    }

    pub fn kill9(&mut self, id: u32) {
        if let Some(mut broker) = self.brokers[(id - 1) as usize].take() {
            broker.kill9();
        }
    }

    pub fn signal(&self, id: u32, signal: &str) {
        let pid = self.brokers[(id - 1) as usize]
            .as_ref()
            .expect("running")
            .pid();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    pub fn bootstrap(&self, id: u32) -> String {
        format!("127.0.0.1:{}", self.ports[(id - 1) as usize])
    }

    /// Every broker's main address, for a client's bootstrap list.
    pub fn bootstrap_all(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn data_dir(&self, id: u32) -> &Path {
        &self.dirs[(id - 1) as usize]
    }

    pub fn logs(&self) -> String {
        self.brokers
            .iter()
            .flatten()
            .map(|b| b.log())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

/// Pipes `count` numbered lines to `ringlog produce --acks ACKS` and returns
/// them once the CLI exited 0 (every record acknowledged).
pub fn produce_with_cli(
    bootstrap: &str,
    topic: &str,
    acks: &str,
    count: usize,
) -> std::collections::BTreeSet<String> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlog"))
        .args(["--bootstrap", bootstrap, "produce", topic, "--acks", acks])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("ringlog runs");
    let lines: Vec<String> = (0..count).map(|i| format!("record-{i:08}")).collect();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all((lines.join("\n") + "\n").as_bytes())
        .unwrap();
    drop(stdin);
    assert!(child.wait().unwrap().success(), "every record acknowledged");
    lines.into_iter().collect()
}
