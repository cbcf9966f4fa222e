//! The S3 listener when the process runs out of file descriptors: `accept` fails for every
//! waiting client; the gateway must back off (not spin) and say so a few times, not once per
//! failed call, then serve again once descriptors are free. A binary of its own: it lowers the
//! whole process's descriptor limit.

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blindfold_gateway::listen::Limits;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

/// Log lines written, kept for the test to count.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// CPU time this process has used, from its `/proc/self/stat` (opened beforehand: no
/// descriptor is free when it is read).
fn cpu(stat: &mut std::fs::File) -> Duration {
    use std::io::{Read as _, Seek as _};
    let mut text = String::new();
    stat.rewind().unwrap();
    stat.read_to_string(&mut text).unwrap();
    let fields: Vec<&str> = text.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime (fields 14 and 15 of stat; 12 and 13 after the name), in clock ticks.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_listener_backs_off_logs_little_and_recovers() {
    let log = Captured::default();
    tracing_subscriber::fmt().with_writer(log.clone()).with_ansi(false).init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Clients wait in the listen queue before the gateway accepts anything (each client's own
    // socket is made while descriptors are still plenty).
    let mut waiting = Vec::new();
    for _ in 0..40 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n").await.unwrap();
        waiting.push(s);
    }
    let saved = getrlimit(Resource::Nofile);
    let mut stat = std::fs::File::open("/proc/self/stat").unwrap();
    let limits = Limits::new(1000, Duration::from_secs(30), Duration::from_secs(30));
    // Just before the accept loop starts, leave it a handful of descriptors.
    let g =
        common::Running::start_on(listener, ("AKFDTEST", "fd-test-secret"), None, limits, || {
            let tight = open_fds() + 4;
            setrlimit(Resource::Nofile, Rlimit { current: Some(tight), maximum: saved.maximum })
                .unwrap();
        })
        .await;
    let cpu_before = cpu(&mut stat);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spent = cpu(&mut stat) - cpu_before;
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    let failures = text.lines().filter(|l| l.contains("accept failed")).count();
    println!("in 3 s out of descriptors: {failures} log lines, {spent:?} of CPU");
    assert!(failures >= 1, "the operator is told: {text}");
    assert!(failures <= 2, "{failures} lines in 3 s: the log grows with every failed accept");
    assert!(text.contains("ulimit"), "the line names the next step: {text}");
    // Descriptors back: every waiting client is answered, and a new one is served.
    setrlimit(Resource::Nofile, saved).unwrap();
    for s in &mut waiting {
        let (head, _) = common::read_response(s, false).await;
        assert!(head.starts_with("http/1.1 403"), "{head}");
    }
    drop(waiting);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    assert!(out.starts_with(b"HTTP/1.1 403"), "{}", String::from_utf8_lossy(&out));
    let _ = std::io::stdout().flush();
    g.stop().await;
}
