//! A few blocking Redis commands over a plain socket (`PING`, `CLUSTER
//! INFO`, `CLUSTER NODES`, `INFO`): what the helpers need to see that a server
//! is up, without a client library or a runtime.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::ports::SHARED_REDIS_PORT;

/// How long one command may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Sends one command to `127.0.0.1:port` and returns the reply: a status, an
/// integer or a bulk string (nil is empty). An error reply is an error.
pub(crate) fn command(port: u16, args: &[&str]) -> io::Result<String> {
    let mut replies = commands(port, &[args], TIMEOUT)?;
    Ok(replies.pop().expect("one reply per command"))
}

/// Sends `commands` in order over one connection to `127.0.0.1:port` and
/// returns their replies, as [`command`]; the connection within a second,
/// each reply within `timeout`. The first error reply is an error.
pub(crate) fn commands(
    port: u16,
    commands: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<String>> {
    if port == SHARED_REDIS_PORT {
        return Err(io::Error::other("port 6379 belongs to the shared Redis"));
    }
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    commands
        .iter()
        .map(|args| {
            let mut request = format!("*{}\r\n", args.len());
            for arg in *args {
                request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
            }
            stream.write_all(request.as_bytes())?;
            read_reply(&mut reader)
        })
        .collect()
}

fn read_reply(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || io::Error::other(format!("unexpected reply {line:?}"));
    match line.split_at_checked(1) {
        Some(("+" | ":", value)) => Ok(value.to_owned()),
        Some(("-", message)) => Err(io::Error::other(message.to_owned())),
        Some(("$", "-1")) => Ok(String::new()),
        Some(("$", len)) => {
            let len: usize = len.parse().map_err(|_| bad())?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            Ok(String::from_utf8_lossy(&body).into_owned())
        }
        _ => Err(bad()),
    }
}

/// Whether the server on `127.0.0.1:port` answers `PING` with `PONG`.
pub(crate) fn pings(port: u16) -> bool {
    command(port, &["PING"]).is_ok_and(|reply| reply == "PONG")
}

/// The value of `field` in an `INFO`-style reply (`field:value` lines).
pub(crate) fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}
