//! Which CPUs the load generator's runtime threads run on: `--cpus` parsed
//! and checked against the process's affinity mask, and each worker thread
//! pinned to one of them as it starts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Largest CPU number `--cpus` accepts (a bound on the parser, far above
/// any host this runs on).
pub const CPU_ID_MAX: usize = 4_095;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CpusError {
    #[error("--cpus {0:?}: expected CPU numbers and ranges, e.g. 1 or 0,2 or 2-3")]
    Syntax(String),
    #[error("--cpus: CPU {cpu} is above {CPU_ID_MAX}")]
    TooLarge { cpu: usize },
    #[error("--cpus: CPU {cpu} is not in this process's affinity mask {allowed:?}")]
    NotAllowed { cpu: usize, allowed: Vec<usize> },
}

/// Parses `1`, `0,2`, `2-3`, `0,4-5` into CPU numbers in the order given,
/// duplicates dropped.
pub fn parse_cpus(list: &str) -> Result<Vec<usize>, CpusError> {
    let syntax = || CpusError::Syntax(list.to_string());
    let number = |s: &str| -> Result<usize, CpusError> {
        let cpu: usize = s.trim().parse().map_err(|_| syntax())?;
        if cpu > CPU_ID_MAX {
            return Err(CpusError::TooLarge { cpu });
        }
        Ok(cpu)
    };
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let cpu = number(part)?;
                (cpu, cpu)
            }
        };
        if first > last {
            return Err(syntax());
        }
        for cpu in first..=last {
            if !cpus.contains(&cpu) {
                cpus.push(cpu);
            }
        }
    }
    Ok(cpus)
}

/// The CPUs this process may run on (what `taskset` or a cpuset left it).
pub fn allowed_cpus() -> Vec<usize> {
    core_affinity::get_core_ids()
        .map(|ids| ids.into_iter().map(|core| core.id).collect())
        .unwrap_or_default()
}

/// Refuses a CPU outside `allowed`: pinning there would fail on every thread.
pub fn check_allowed(cpus: &[usize], allowed: &[usize]) -> Result<(), CpusError> {
    match cpus.iter().find(|cpu| !allowed.contains(cpu)) {
        Some(&cpu) => Err(CpusError::NotAllowed {
            cpu,
            allowed: allowed.to_vec(),
        }),
        None => Ok(()),
    }
}

/// The CPU worker `index` is pinned to: the list in turn. The hook below
/// and the run's report both ask here, so they cannot disagree.
pub fn worker_cpu(cpus: &[usize], index: usize) -> Option<usize> {
    (!cpus.is_empty()).then(|| cpus[index % cpus.len()])
}

/// A hook for the runtime's thread start: the first `workers` threads to
/// start (the runtime's workers, which it starts when it is built) are
/// pinned to `cpus` in turn; later threads (blocking helpers) are left to
/// the scheduler. Empty `cpus`: nothing is pinned.
pub fn pin_workers(cpus: Vec<usize>, workers: usize) -> impl Fn() + Send + Sync + 'static {
    let started = Arc::new(AtomicUsize::new(0));
    move || {
        let index = started.fetch_add(1, Ordering::Relaxed);
        if let Some(id) = worker_cpu(&cpus, index).filter(|_| index < workers) {
            // Checked against the mask before the runtime starts; a refusal
            // now (the mask changed under the process) leaves the thread
            // where the scheduler puts it, which the report then overstates.
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_ranges_parse_in_order_without_duplicates() {
        assert_eq!(parse_cpus("1"), Ok(vec![1]));
        assert_eq!(parse_cpus("2,0"), Ok(vec![2, 0]));
        assert_eq!(parse_cpus("0,2-4,3"), Ok(vec![0, 2, 3, 4]));
        for bad in ["", "a", "1,", "3-1", "-1", "1--2"] {
            assert_eq!(
                parse_cpus(bad),
                Err(CpusError::Syntax(bad.to_string())),
                "{bad:?}"
            );
        }
        assert_eq!(parse_cpus("4096"), Err(CpusError::TooLarge { cpu: 4096 }));
    }

    #[test]
    fn a_cpu_outside_the_mask_is_refused() {
        assert_eq!(check_allowed(&[1], &[0, 1]), Ok(()));
        assert_eq!(
            check_allowed(&[0, 3], &[0, 1]),
            Err(CpusError::NotAllowed {
                cpu: 3,
                allowed: vec![0, 1]
            })
        );
    }

    #[test]
    fn workers_are_pinned_to_the_cpus_in_turn() {
        let allowed = allowed_cpus();
        let Some(&cpu) = allowed.last() else {
            return; // no affinity mask to read on this platform
        };
        let hook = pin_workers(vec![cpu], 1);
        let pinned = std::thread::spawn(move || {
            hook();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(pinned, vec![cpu]);
    }
}
