//! The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_start_time_seconds`),
//! under the names every Prometheus client library uses, so the dashboards and alerts written for any
//! service work for a runner too. Read from `/proc/self` at scrape time (Linux; on another system they are
//! simply absent).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What `/proc/self` says about this process right now.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub open_fds: u64,
    /// The soft limit on open files.
    pub max_fds: Option<u64>,
    /// When the process started, seconds since the epoch.
    pub start_time_seconds: f64,
}

impl ProcessStats {
    /// This process's figures; `None` where `/proc` cannot be read.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        // SAFETY: sysconf only reads a system constant.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        parse(
            &stat,
            &boot,
            &limits,
            open_fds,
            u64::try_from(ticks).ok().filter(|t| *t > 0)?,
            u64::try_from(page).ok().filter(|p| *p > 0)?,
        )
    }
}

/// The figures from the text of `/proc/self/stat`, `/proc/stat` and `/proc/self/limits` (pure, for tests).
fn parse(
    stat: &str,
    boot: &str,
    limits: &str,
    open_fds: u64,
    ticks_per_second: u64,
    page_size: u64,
) -> Option<ProcessStats> {
    // The command name (field 2) is in parentheses and may hold spaces: the fields after it follow the
    // last `)`. Field 3 (state) is the first of them.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let utime = field(14)?;
    let stime = field(15)?;
    let start_ticks = field(22)?;
    let vsize = field(23)?;
    let rss_pages = field(24)?;
    let boot_time: u64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|soft| soft.parse().ok());
    let ticks = ticks_per_second as f64;
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks,
        resident_bytes: rss_pages * page_size,
        virtual_bytes: vsize,
        open_fds,
        max_fds,
        start_time_seconds: boot_time as f64 + start_ticks as f64 / ticks,
    })
}

/// The collector registered (without the `volcano_runner_` prefix) beside the runner's own metrics.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size, in bytes",
                Some(s.resident_bytes as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes",
                Some(s.virtual_bytes as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                Some(s.open_fds as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds.map(|m| m as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                Some(s.start_time_seconds),
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_text_is_read_field_by_field() {
        // A command name with a space and a parenthesis, as /proc writes it.
        let stat = "4242 (volcano (x) r) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 0 0 20 0 9 0 \
                    12000 104857600 3000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let boot = "cpu  1 2 3\nbtime 1764000000\nprocesses 10\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 1048576              files\n";
        let s = parse(stat, boot, limits, 17, 100, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.resident_bytes, 3000 * 4096);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.open_fds, 17);
        assert_eq!(s.max_fds, Some(1024));
        assert_eq!(s.start_time_seconds, 1_764_000_120.0);
    }

    #[test]
    fn this_process_is_read() {
        let s = ProcessStats::read().expect("/proc is there on Linux");
        assert!(s.resident_bytes > 0 && s.open_fds > 0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(s.start_time_seconds <= now && s.start_time_seconds > now - 86_400.0);
    }
}
