//! CPU time of this process, in total and by thread group, for the CPU lines of `ledger-relay
//! demo` and `ledger-bench cpu`: both run a relay's and a subscriber's work (or a baseline's
//! two ends) in one process and tell them apart by thread name.

use std::collections::BTreeMap;
use std::time::Duration;

/// User plus system CPU time of this process so far (`getrusage(RUSAGE_SELF)`).
pub fn process_cpu() -> Option<Duration> {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let secs = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Some(secs(u.user_time()) + secs(u.system_time()))
}

/// CPU time of this process's live threads, summed by the group `group` gives each thread's
/// name. Read from `/proc/self/task/*/schedstat` (nanoseconds on the CPU); threads that have
/// exited are not listed, so the groups can sum to less than [`process_cpu`]. Empty where
/// `/proc` is not available.
pub fn thread_cpu(group: impl Fn(&str) -> &'static str) -> BTreeMap<&'static str, Duration> {
    let mut groups = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return groups;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("schedstat")),
        ) else {
            continue;
        };
        let Some(ns) = stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        *groups.entry(group(comm.trim())).or_insert(Duration::ZERO) += Duration::from_nanos(ns);
    }
    groups
}

/// `after - before` for every group of `after` (a group absent before counts from zero).
pub fn since(
    before: &BTreeMap<&'static str, Duration>,
    after: BTreeMap<&'static str, Duration>,
) -> BTreeMap<&'static str, Duration> {
    after
        .into_iter()
        .map(|(g, t)| {
            (
                g,
                t.saturating_sub(before.get(g).copied().unwrap_or_default()),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_shows_in_its_group_and_in_the_process() {
        let before = (process_cpu().unwrap(), thread_cpu(group_of));
        let spin = std::thread::Builder::new()
            .name("spinner".into())
            .spawn(|| {
                // Spins until it has had 40 ms of CPU by its own count (a loaded machine gives
                // it less than its wall time), at most 10 s.
                let own = || -> u64 {
                    std::fs::read_to_string("/proc/thread-self/schedstat")
                        .ok()
                        .and_then(|s| s.split_whitespace().next()?.parse().ok())
                        .unwrap_or(0)
                };
                let start = std::time::Instant::now();
                let mut x = 0u64;
                while own() < 40_000_000 && start.elapsed() < Duration::from_secs(10) {
                    for _ in 0..10_000 {
                        x = x.wrapping_mul(31).wrapping_add(7);
                    }
                }
                // Still alive while measured: waits for the main thread's reading.
                std::thread::park_timeout(Duration::from_secs(10));
                x
            })
            .unwrap();
        while !spin.is_finished()
            && thread_cpu(group_of)
                .get("spin")
                .copied()
                .unwrap_or_default()
                < Duration::from_millis(40)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = since(&before.1, thread_cpu(group_of));
        let total = process_cpu().unwrap() - before.0;
        spin.thread().unpark();
        spin.join().unwrap();
        let spun = after.get("spin").copied().unwrap_or_default();
        assert!(spun >= Duration::from_millis(40), "{after:?}");
        assert!(total >= Duration::from_millis(40), "{total:?}");
    }

    fn group_of(name: &str) -> &'static str {
        if name.starts_with("spinner") {
            "spin"
        } else {
            "other"
        }
    }
}
