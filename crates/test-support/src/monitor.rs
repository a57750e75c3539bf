//! A watcher of what a Redis server runs, through `MONITOR`: the exact
//! commands a store sent, even while other tests share the server.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

use crate::env::unique;

/// The commands one Redis server runs, as `MONITOR` shows them, that
/// mention `marker` (a test's unique name): what a store sent, counted
/// exactly even while other tests use the same server. Stops when dropped.
pub struct Monitor {
    address: String,
    marker: String,
    seen: Arc<(Mutex<Vec<String>>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl Monitor {
    /// Starts monitoring the server at `url` (a `redis://host:port` URL);
    /// returns once the server has confirmed.
    pub fn start(url: &str, marker: &str) -> Monitor {
        let address = match redis::Client::open(url)
            .expect("a Redis URL")
            .get_connection_info()
            .addr()
        {
            redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => panic!("MONITOR needs a TCP URL, not {other:?}"),
        };
        let mut stream = TcpStream::connect(&address).expect("connect");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("MONITOR's answer");
        assert_eq!(line.trim_end(), "+OK", "MONITOR answered {line:?}");
        // From now on, short reads: the thread looks at its stop flag.
        reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let seen = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (found, done, wanted) =
            (seen.clone(), stop.clone(), marker.to_owned());
        thread::spawn(move || {
            // A line may arrive in parts across read timeouts: it is kept
            // until its end.
            let mut line = String::new();
            while !done.load(Ordering::SeqCst) {
                match reader.read_line(&mut line) {
                    Ok(0) => return,
                    Ok(_) if line.ends_with('\n') => {
                        if line.contains(&wanted) {
                            let (lines, changed) = &*found;
                            lines
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(line.trim_end().to_owned());
                            changed.notify_all();
                        }
                        line.clear();
                    }
                    // Part of a line, or the read timed out (to look at the
                    // stop flag).
                    Ok(_) | Err(_) => {}
                }
            }
        });
        Monitor {
            address,
            marker: marker.to_owned(),
            seen,
            stop,
        }
    }

    /// The commands sent by clients that mention the marker so far, each
    /// as its words with the name lower-cased: e.g. `["evalsha", "<sha>",
    /// "2", "trt:...", ...]`. A script's `EVALSHA` may show twice: once
    /// refused with `NOSCRIPT` (another test flushed the scripts), and again
    /// after the reload.
    pub fn client_commands(&self) -> Vec<Vec<String>> {
        self.lines(false)
    }

    /// The commands run inside scripts that mention the marker so far: one
    /// `GET` of each key per run of a script that reads it.
    pub fn script_commands(&self) -> Vec<Vec<String>> {
        self.lines(true)
    }

    /// Waits until every command sent before this call has been seen.
    fn lines(&self, in_scripts: bool) -> Vec<Vec<String>> {
        // A command of our own, after everything else: once MONITOR shows
        // it, it has shown everything before it.
        let fence = format!("{}-fence-{}", self.marker, unique("m"));
        let mut conn = TcpStream::connect(&self.address).expect("connect");
        let echo =
            format!("*2\r\n$4\r\nECHO\r\n${}\r\n{fence}\r\n", fence.len());
        conn.write_all(echo.as_bytes()).expect("ECHO");
        let (lines, changed) = &*self.seen;
        let lines = lines.lock().unwrap_or_else(PoisonError::into_inner);
        let (lines, timeout) = changed
            .wait_timeout_while(lines, Duration::from_secs(10), |lines| {
                !lines.iter().any(|l| l.contains(&fence))
            })
            .unwrap_or_else(PoisonError::into_inner);
        assert!(!timeout.timed_out(), "MONITOR did not show {fence}");
        lines
            .iter()
            .filter(|line| !line.contains("-fence-"))
            .filter(|line| line.contains(" lua] ") == in_scripts)
            .map(|line| monitor_words(line))
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The quoted words of a MONITOR line, the command's name lower-cased:
/// `1.2 [0 127.0.0.1:5] "EVALSHA" "ab" "1" "k"` gives
/// `["evalsha", "ab", "1", "k"]`. A backslash escapes the next character
/// (MONITOR escapes quotes inside a script's source); escapes are kept
/// as written.
fn monitor_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    while chars.by_ref().any(|c| c == '"') {
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    word.push(c);
                    word.extend(chars.next());
                }
                _ => word.push(c),
            }
        }
        words.push(word);
    }
    if let Some(name) = words.first_mut() {
        *name = name.to_lowercase();
    }
    words
}
