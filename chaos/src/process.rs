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

/// How long a start waits for the ports the process will listen on to be
/// free. A restart that binds a port still taken dies on "address already
/// in use"; waiting first rides out whatever held it briefly, and a port
/// that stays taken is reported with its holder. Longer than Linux's 60 s
/// TIME-WAIT: a CI run found a broker's port held for more than 10 s by a
/// connection of an earlier life in TIME-WAIT, which a listener bound with
/// SO_REUSEPORT alone (as the broker's shards bind) does not pass.
pub const PORTS_FREE_WAIT_MS_MAX: u64 = 65_000;

#[derive(Debug)]
pub struct Process {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    netns: Option<String>,
    /// Ports on 127.0.0.1 the process listens on, each with how it binds
    /// (none inside a namespace).
    listen_ports: Vec<(u16, Bind)>,
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
            listen_ports: Vec::new(),
            log,
            child: None,
            crashes: Vec::new(),
        }
    }

    /// Names the ports on 127.0.0.1 the process will listen on, so a start
    /// first waits for them to be free.
    pub fn with_listen_ports(mut self, ports: Vec<(u16, Bind)>) -> Process {
        self.listen_ports = ports;
        self
    }

    pub fn start(&mut self) -> io::Result<()> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        if self.netns.is_none() {
            wait_for_free_ports(&self.name, &self.listen_ports)?;
        }
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

/// How a process binds a listening port, which decides what a connection
/// its previous life left behind (in TIME-WAIT or FIN-WAIT) does to a bind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// SO_REUSEADDR and SO_REUSEPORT: the broker's listeners.
    ReuseAddressAndPort,
    /// SO_REUSEADDR only: the controller's listener (tokio), also when a
    /// broker embeds it.
    ReuseAddress,
}

/// Whether a listener can bind `port` on 127.0.0.1 with the options the
/// process binds it with, so what stands in the probe's way (another
/// process's listener, connections in TIME-WAIT) is exactly what would stand
/// in the process's.
fn can_bind(port: u16, bind: Bind) -> bool {
    use socket2::{Domain, Socket, Type};
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    Socket::new(Domain::IPV4, Type::STREAM, None)
        .and_then(|socket| {
            match bind {
                Bind::ReuseAddressAndPort => {
                    socket.set_reuse_address(true)?;
                    socket.set_reuse_port(true)?;
                }
                Bind::ReuseAddress => socket.set_reuse_address(true)?,
            }
            socket.bind(&address.into())
        })
        .is_ok()
}

/// Waits until every port can be bound on 127.0.0.1; if one stays taken,
/// the error names whoever holds it.
fn wait_for_free_ports(name: &str, ports: &[(u16, Bind)]) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(PORTS_FREE_WAIT_MS_MAX);
    loop {
        let taken = ports.iter().find(|&&(port, bind)| !can_bind(port, bind));
        let Some(&(port, _)) = taken else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            let holder = Command::new("ss")
                .args(["-Htanp", &format!("sport = :{port}")])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "starting {name}: port {port} still taken after {PORTS_FREE_WAIT_MS_MAX} ms: {}",
                    if holder.is_empty() { "no socket listed by ss" } else { &holder }
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A paused process must be resumed to die cleanly on SIGKILL's reap.
        self.signal(Signal::SIGCONT);
        self.kill9();
    }
}
