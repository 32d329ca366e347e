//! One process under test (a broker or a controller): started from its
//! binary, optionally inside a network namespace, with its standard error
//! appended to a log file across restarts; stopped, killed, paused and
//! resumed by signal; and asked whether it died on its own (a crash).

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a SIGTERM'd process may take to exit before it counts as hung.
pub const STOP_MS_MAX: u64 = 30_000;

#[derive(Debug)]
pub struct Process {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    netns: Option<String>,
    pub log: PathBuf,
    child: Option<Child>,
    /// Exits nobody asked for, with the log's last lines.
    crashes: Vec<String>,
}

impl Process {
    pub fn new(
        name: &str,
        program: &Path,
        args: Vec<String>,
        netns: Option<String>,
        log: PathBuf,
    ) -> Process {
        Process {
            name: name.to_owned(),
            program: program.to_path_buf(),
            args,
            netns,
            log,
            child: None,
            crashes: Vec::new(),
        }
    }

    pub fn start(&mut self) -> io::Result<()> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        let child = command
            .args(&self.args)
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn pid(&self) -> Option<Pid> {
        self.child.as_ref().map(|c| Pid::from_raw(c.id() as i32))
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(pid, signal);
        }
    }

    /// kill -9, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for the exit: the graceful path. A process that
    /// hangs is killed and reported.
    pub fn terminate(&mut self) -> Result<ExitStatus, String> {
        let Some(mut child) = self.child.take() else {
            return Err(format!("{} is not running", self.name));
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_millis(STOP_MS_MAX);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{} did not exit within {STOP_MS_MAX} ms of SIGTERM",
                        self.name
                    ));
                }
            }
        }
    }

    /// Notes the process if it exited without being asked; returns whether it
    /// is (still) running.
    pub fn check_alive(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.child = None;
                let note = format!(
                    "{} exited on its own ({status}); log ends:\n{}",
                    self.name,
                    self.log_tail(20)
                );
                self.crashes.push(note);
                false
            }
            Err(_) => true,
        }
    }

    pub fn take_crashes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.crashes)
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A paused process must be resumed to die cleanly on SIGKILL's reap.
        self.signal(Signal::SIGCONT);
        self.kill9();
    }
}
