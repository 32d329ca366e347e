//! CPU time of the load generator and of the whole machine over the measured
//! seconds, read from `/proc`, so a report shows what the load generator
//! itself cost beside what the rest of the machine (the broker, on a host
//! running nothing else) used: the two share the cores in every scenario.

use serde::Serialize;

/// One reading of the process's and the machine's CPU counters, in the
/// kernel's clock ticks (the same unit in both files, so only ratios are
/// taken and the tick rate never matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSample {
    /// User plus system time of every thread of this process.
    pub process_ticks: u64,
    /// Time any CPU spent running something (user, nice, system, interrupts).
    pub machine_busy_ticks: u64,
    /// Busy plus idle, I/O wait and time stolen by a hypervisor.
    pub machine_total_ticks: u64,
    /// Time a hypervisor gave this machine's CPUs to someone else.
    pub machine_steal_ticks: u64,
    /// CPUs the machine counts (`cpuN` lines).
    pub cpus: u32,
}

/// CPU use between two samples, in cores: 1.0 is one core busy the whole time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuUse {
    pub loadgen_cores: f64,
    /// Everything else that ran: the broker, its kernel I/O workers, and any
    /// other process on the host.
    pub other_cores: f64,
    /// Taken by the hypervisor for other guests: a busy host shows here.
    pub stolen_cores: f64,
    pub machine_cores: u32,
}

impl CpuSample {
    /// `None` where `/proc` is missing or unreadable: the report then says
    /// nothing about CPU rather than something wrong.
    pub fn read() -> Option<CpuSample> {
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let machine = std::fs::read_to_string("/proc/stat").ok()?;
        CpuSample::parse(&own, &machine)
    }

    pub fn parse(own_stat: &str, machine_stat: &str) -> Option<CpuSample> {
        let process_ticks = process_ticks(own_stat)?;
        let [machine_busy_ticks, machine_total_ticks, machine_steal_ticks] =
            machine_ticks(machine_stat)?;
        let cpus = machine_stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l[3..].starts_with(|c: char| c.is_ascii_digit()))
            .count() as u32;
        (cpus > 0).then_some(CpuSample {
            process_ticks,
            machine_busy_ticks,
            machine_total_ticks,
            machine_steal_ticks,
            cpus,
        })
    }

    /// Use from `self` to `later`; `None` when no time passed between them.
    pub fn until(&self, later: &CpuSample) -> Option<CpuUse> {
        let total = later
            .machine_total_ticks
            .checked_sub(self.machine_total_ticks)?;
        if total == 0 {
            return None;
        }
        let own = later.process_ticks.saturating_sub(self.process_ticks);
        let busy = later
            .machine_busy_ticks
            .saturating_sub(self.machine_busy_ticks);
        let stolen = later
            .machine_steal_ticks
            .saturating_sub(self.machine_steal_ticks);
        // The machine line sums every CPU: `total` ticks are `cpus` cores
        // for the interval.
        let cores = |ticks: u64| ticks as f64 * f64::from(later.cpus) / total as f64;
        Some(CpuUse {
            loadgen_cores: cores(own),
            other_cores: cores(busy.saturating_sub(own)),
            stolen_cores: cores(stolen),
            machine_cores: later.cpus,
        })
    }
}

/// utime + stime of `/proc/self/stat`: fields 14 and 15, counted after the
/// command name, which may itself hold spaces and parentheses.
fn process_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// [busy, total, steal] from the first line of `/proc/stat`: user nice
/// system idle iowait irq softirq steal (guest time is already counted in
/// user).
fn machine_ticks(stat: &str) -> Option<[u64; 3]> {
    let line = stat.lines().next()?;
    let mut words = line.split_whitespace();
    if words.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = words
        .take(8)
        .map(|w| w.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = values[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq;
    Some([busy, busy + idle + iowait + steal, steal])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINE_AT_0: &str = "cpu  1000 0 500 7980 100 0 0 20 0 0\ncpu0 500 0 250 4000 50 0 0 0 0 0\ncpu1 500 0 250 4000 50 0 0 0 0 0\nintr 1\n";
    const MACHINE_AT_1: &str = "cpu  1120 0 560 7990 100 0 0 30 0 0\ncpu0 560 0 280 4010 50 0 0 0 0 0\ncpu1 560 0 280 4010 50 0 0 0 0 0\nintr 2\n";

    fn own(utime: u64, stime: u64) -> String {
        format!(
            "4242 (ringlog (load) gen) S 1 4242 4242 0 -1 4194560 100 0 0 0 {utime} {stime} 0 0 20 0 6 0 1 1 1"
        )
    }

    #[test]
    fn parses_a_command_name_with_spaces_and_parentheses() {
        let sample = CpuSample::parse(&own(70, 30), MACHINE_AT_0).expect("parsed");
        assert_eq!(sample.process_ticks, 100);
        assert_eq!(sample.machine_busy_ticks, 1500);
        assert_eq!(sample.machine_total_ticks, 9600);
        assert_eq!(sample.machine_steal_ticks, 20);
        assert_eq!(sample.cpus, 2);
    }

    #[test]
    fn splits_the_machine_between_the_load_generator_and_the_rest() {
        let before = CpuSample::parse(&own(70, 30), MACHINE_AT_0).expect("parsed");
        // 200 ticks passed over two CPUs, 100 each; 180 of them busy, 60
        // of those the load generator's, and 10 stolen.
        let after = CpuSample::parse(&own(110, 50), MACHINE_AT_1).expect("parsed");
        let used = before.until(&after).expect("time passed");
        assert_eq!(used.machine_cores, 2);
        assert!((used.loadgen_cores - 0.6).abs() < 1e-9, "{used:?}");
        assert!((used.other_cores - 1.2).abs() < 1e-9, "{used:?}");
        assert!((used.stolen_cores - 0.1).abs() < 1e-9, "{used:?}");
    }

    #[test]
    fn no_time_passed_or_unreadable_files_give_nothing() {
        let sample = CpuSample::parse(&own(1, 1), MACHINE_AT_0).expect("parsed");
        assert_eq!(sample.until(&sample), None);
        assert_eq!(CpuSample::parse("garbage", MACHINE_AT_0), None);
        assert_eq!(CpuSample::parse(&own(1, 1), "intr 1\n"), None);
        assert_eq!(CpuSample::parse(&own(1, 1), "cpu 1 2 3\n"), None);
    }

    #[test]
    fn reads_this_process_and_this_machine() {
        let sample = CpuSample::read().expect("/proc is mounted on Linux");
        assert!(sample.cpus >= 1);
        assert!(sample.machine_busy_ticks <= sample.machine_total_ticks);
    }
}
