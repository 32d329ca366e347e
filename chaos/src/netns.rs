//! Network namespaces joined by a bridge, so the fault suite can cut one
//! host off from some peers while others (the clients in the root namespace)
//! still reach it: each process under test gets a namespace with one veth
//! into the bridge, and a partition is a set of blackhole routes on both
//! sides. Needs root and iproute2; everything is removed on drop.

use std::io;
use std::process::Command;

/// The bridge's /24; the root namespace (clients) is .1.
const SUBNET_PREFIX: &str = "10.88.0";
const BRIDGE: &str = "rlchaos0";
const NAME_PREFIX: &str = "rlchaos";

fn ip(args: &[&str]) -> io::Result<()> {
    let output = Command::new("ip").args(args).output()?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether namespaces can be made here: root and the `ip` tool.
pub fn available() -> bool {
    let root = nix::unistd::geteuid().is_root();
    root && Command::new("ip")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The hosts of one test network, host `i` at `10.88.0.(10 + i)`.
#[derive(Debug)]
pub struct Network {
    hosts: usize,
}

impl Network {
    pub fn create(hosts: usize) -> io::Result<Network> {
        assert!(hosts < 200, "hosts fit the /24");
        Network::remove_leftovers(hosts);
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        let network = Network { hosts };
        ip(&[
            "addr",
            "add",
            &format!("{SUBNET_PREFIX}.1/24"),
            "dev",
            BRIDGE,
        ])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for host in 0..hosts {
            let ns = Network::namespace(host);
            let (outer, inner) = (format!("{NAME_PREFIX}v{host}"), "eth0");
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", inner, "netns", &ns,
            ])?;
            ip(&["link", "set", &outer, "master", BRIDGE, "up"])?;
            let address = format!("{}/24", network.address(host));
            ip(&["-n", &ns, "addr", "add", &address, "dev", inner])?;
            ip(&["-n", &ns, "link", "set", inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(network)
    }

    pub fn namespace(host: usize) -> String {
        format!("{NAME_PREFIX}{host}")
    }

    pub fn address(&self, host: usize) -> String {
        format!("{SUBNET_PREFIX}.{}", 10 + host)
    }

    /// Cuts `host` off from each of `peers`, both ways; the root namespace
    /// still reaches it.
    pub fn isolate(&self, host: usize, peers: &[usize]) -> io::Result<()> {
        for &peer in peers {
            self.blackhole("add", host, peer)?;
            self.blackhole("add", peer, host)?;
        }
        Ok(())
    }

    /// Undoes `isolate`.
    pub fn heal(&self, host: usize, peers: &[usize]) -> io::Result<()> {
        for &peer in peers {
            self.blackhole("del", host, peer)?;
            self.blackhole("del", peer, host)?;
        }
        Ok(())
    }

    fn blackhole(&self, verb: &str, from: usize, to: usize) -> io::Result<()> {
        let ns = Network::namespace(from);
        let target = format!("{}/32", self.address(to));
        ip(&["-n", &ns, "route", verb, "blackhole", &target])
    }

    fn remove_leftovers(hosts: usize) {
        let _ = ip(&["link", "del", BRIDGE]);
        for host in 0..hosts.max(16) {
            let _ = ip(&["netns", "del", &Network::namespace(host)]);
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        Network::remove_leftovers(self.hosts);
    }
}
