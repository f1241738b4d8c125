//! The process' own figures (CPU, memory, file descriptors, start time), read from `/proc/self`
//! each time the page is written, as Prometheus' client libraries name them.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::{counter, describe, gauge};

/// The process' own figures, as Prometheus' client libraries name them, read from `/proc/self`
/// at scrape time (Linux only: elsewhere nothing is written).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessFigures {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_memory_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_memory_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The limit of open file descriptors (the soft one; 0 when unlimited or unread).
    pub max_fds: u64,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Clock ticks per second of `/proc`'s times (`USER_HZ`): 100 on every Linux architecture the
/// service is built for; reading `sysconf(_SC_CLK_TCK)` would take `unsafe` code.
const USER_HZ: f64 = 100.0;

impl ProcessFigures {
    /// This process' figures; `None` where `/proc` is not there.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
        Self::parse(&stat, &status, &boot, &limits, open_fds)
    }

    /// The figures from the text of `/proc/self/stat`, `/proc/self/status`, `/proc/stat` and
    /// `/proc/self/limits`, and the count of `/proc/self/fd`.
    pub fn parse(
        stat: &str,
        status: &str,
        boot: &str,
        limits: &str,
        open_fds: usize,
    ) -> Option<Self> {
        // The command name, in parentheses, may hold spaces: fields are counted after it.
        let fields: Vec<&str> = stat
            .get(stat.rfind(')')? + 1..)?
            .split_whitespace()
            .collect();
        // Fields 14, 15, 22 and 23 of proc(5), counted from field 3 (the state).
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
        let (utime, stime) = (number(11)?, number(12)?);
        let started_ticks = number(19)?;
        let virtual_bytes = fields.get(20)?.parse::<u64>().ok()?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        let btime = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())?;
        let max_fds = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        Some(Self {
            cpu_seconds: (utime + stime) / USER_HZ,
            resident_memory_bytes: rss_kib.saturating_mul(1024),
            virtual_memory_bytes: virtual_bytes,
            open_fds: open_fds as u64,
            max_fds,
            start_time_seconds: btime + started_ticks / USER_HZ,
        })
    }

    /// Writes the `process_*` families.
    pub fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        counter(
            &mut describe(encoder, "process_cpu_seconds_total")?,
            &[],
            self.cpu_seconds,
        )?;
        for (name, value) in [
            ("process_resident_memory_bytes", self.resident_memory_bytes),
            ("process_virtual_memory_bytes", self.virtual_memory_bytes),
            ("process_open_fds", self.open_fds),
            ("process_max_fds", self.max_fds),
        ] {
            gauge(&mut describe(encoder, name)?, &[], value)?;
        }
        gauge(
            &mut describe(encoder, "process_start_time_seconds")?,
            &[],
            self.start_time_seconds,
        )
    }
}

/// The `process_*` families, read when the page is written (nothing where `/proc` is not).
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match ProcessFigures::read() {
            Some(p) => p.encode(&mut encoder),
            None => Ok(()),
        }
    }
}
