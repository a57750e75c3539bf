//! [`TcpProxy`]: a loopback TCP proxy for fault tests, on a thread and a
//! runtime of its own.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc as std_mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::error::{Error, Result};
use crate::ports::try_free_port;

/// How long the proxy tries to reach its target for a new connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`TcpProxy::cut`] waits for every connection to be closed.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
const BUFFER: usize = 16 * 1024;

/// A TCP proxy on a loopback port that forwards each connection to a target
/// (e.g. a [`RedisServer`](crate::RedisServer)), and breaks the path the way
/// networks break:
///
/// - [`freeze`](Self::freeze): the connections that exist stop moving. The
///   proxy keeps their sockets open and reads nothing, writes nothing: each
///   peer sees a silent connection, as after the loss of a VM or a network
///   partition, with no reset and no close. New connections still go through
///   to the target (as a client that reconnects would find a new path).
/// - [`blackhole`](Self::blackhole): the same, and new connections are
///   accepted but held silent too.
/// - [`cut`](Self::cut): every connection is closed and new ones are refused,
///   as when the target's host is down.
/// - [`heal`](Self::heal): back to forwarding, frozen connections included
///   (what they were sent meanwhile is then delivered).
/// - [`set_target`](Self::set_target): new connections go elsewhere (a
///   failover behind a name).
///
/// Counters tell how many connections were accepted, are open, are frozen.
/// The proxy runs on its own thread and Tokio runtime: it keeps working
/// while a test blocks, and whatever runtime the test uses. Every method
/// returns once its effect holds: after `freeze` no byte moves on a frozen
/// connection; after `cut` every connection is closed and the port refuses.
/// Dropping the proxy closes everything.
///
/// ```no_run
/// use rate_tier_test_support::{RedisServer, TcpProxy};
///
/// let server = RedisServer::start();
/// let proxy = TcpProxy::start(server.addr());
/// let url = proxy.redis_url(); // give this to the client under test
/// // ... the client connects and works through the proxy ...
/// proxy.freeze(); // its connection goes silent; a new one would work
/// assert_eq!(proxy.frozen(), proxy.open());
/// ```
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    target: Mutex<SocketAddr>,
    state: Mutex<State>,
    accepted: AtomicU64,
}

struct State {
    mode: Mode,
    next_id: u64,
    /// Every open connection's flow; a connection removes itself when closed.
    connections: HashMap<u64, Arc<watch::Sender<Flow>>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    Blackhole,
    Cut,
}

/// What one connection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Forward,
    Frozen,
    Closed,
}

enum Command {
    /// Stop listening (new connections are refused).
    Close(std_mpsc::Sender<()>),
    /// Listen again on the same port.
    Listen(std_mpsc::Sender<io::Result<()>>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TcpProxy {
    /// A proxy on a free loopback port to `target`.
    ///
    /// # Panics
    ///
    /// If it cannot listen (see [`try_start`](Self::try_start)).
    pub fn start(target: SocketAddr) -> Self {
        Self::try_start(target).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`TcpProxy::start`], as a `Result`.
    pub fn try_start(target: SocketAddr) -> Result<Self> {
        let mut attempts = 0;
        let listener = loop {
            let port = try_free_port()?;
            match std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(listener) => break listener,
                // Taken since it was found free: another port.
                Err(_) if attempts < 3 => attempts += 1,
                Err(e) => {
                    return Err(Error::new(format!(
                        "the proxy could not listen: {e}"
                    )));
                }
            }
        };
        let addr = listener
            .local_addr()
            .and_then(|addr| listener.set_nonblocking(true).map(|()| addr))
            .map_err(|e| {
                Error::new(format!("the proxy could not listen: {e}"))
            })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::new(format!("the proxy's runtime: {e}")))?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            state: Mutex::new(State {
                mode: Mode::Forward,
                next_id: 0,
                connections: HashMap::new(),
            }),
            accepted: AtomicU64::new(0),
        });
        let (commands, receiver) = mpsc::unbounded_channel();
        let (ready, started) = std_mpsc::channel();
        let thread = thread::Builder::new()
            .name(format!("trt-proxy-{}", addr.port()))
            .spawn({
                let shared = shared.clone();
                move || {
                    runtime
                        .block_on(run(listener, addr, shared, receiver, ready))
                }
            })
            .map_err(|e| Error::new(format!("the proxy's thread: {e}")))?;
        let proxy = Self {
            addr,
            shared,
            commands,
            thread: Some(thread),
        };
        match started.recv() {
            Ok(Ok(())) => Ok(proxy),
            Ok(Err(e)) => {
                Err(Error::new(format!("the proxy could not listen: {e}")))
            }
            Err(_) => {
                Err(Error::new("the proxy's thread ended before it listened"))
            }
        }
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `redis://127.0.0.1:<port>/`: a Redis URL through the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Where new connections go.
    pub fn target(&self) -> SocketAddr {
        *lock(&self.shared.target)
    }

    /// Sends new connections to `target`; open ones keep theirs.
    pub fn set_target(&self, target: SocketAddr) {
        *lock(&self.shared.target) = target;
    }

    /// Freezes every open connection: from now on the proxy reads nothing
    /// from either side and writes nothing to either side, and keeps both
    /// sockets open. New connections still go through.
    pub fn freeze(&self) {
        let state = lock(&self.shared.state);
        freeze_all(&state);
    }

    /// [`freeze`](Self::freeze), and new connections are accepted but held
    /// silent (never forwarded) until [`heal`](Self::heal).
    pub fn blackhole(&self) {
        let mut state = lock(&self.shared.state);
        if state.mode == Mode::Forward {
            state.mode = Mode::Blackhole;
        }
        freeze_all(&state);
    }

    /// Closes every connection (frozen ones too) and refuses new ones until
    /// [`heal`](Self::heal). Returns once every connection is closed.
    ///
    /// # Panics
    ///
    /// If the connections are not all closed within 5 s.
    pub fn cut(&self) {
        {
            let mut state = lock(&self.shared.state);
            state.mode = Mode::Cut;
            for flow in state.connections.values() {
                flow.send_replace(Flow::Closed);
            }
        }
        let (done, closed) = std_mpsc::channel();
        if self.commands.send(Command::Close(done)).is_ok() {
            let _ = closed.recv();
        }
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        while self.open() > 0 {
            assert!(
                Instant::now() < deadline,
                "the proxy on {} could not close its {} connections within {:?}",
                self.addr,
                self.open(),
                CLOSE_TIMEOUT
            );
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Forwards again: listens again after a [`cut`](Self::cut), lets frozen
    /// and held connections through, and new connections go through.
    ///
    /// # Panics
    ///
    /// If the port cannot be listened on again.
    pub fn heal(&self) {
        let was_cut = lock(&self.shared.state).mode == Mode::Cut;
        if was_cut {
            let (done, listening) = std_mpsc::channel();
            let result = self
                .commands
                .send(Command::Listen(done))
                .ok()
                .and_then(|()| listening.recv().ok());
            match result {
                Some(Ok(())) => {}
                Some(Err(e)) => panic!(
                    "the proxy could not listen on {} again: {e}",
                    self.addr
                ),
                None => panic!("the proxy's thread has ended"),
            }
        }
        let mut state = lock(&self.shared.state);
        state.mode = Mode::Forward;
        for flow in state.connections.values() {
            flow.send_if_modified(|flow| {
                let frozen = *flow == Flow::Frozen;
                if frozen {
                    *flow = Flow::Forward;
                }
                frozen
            });
        }
    }

    /// Connections accepted since the start.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now (frozen ones included).
    pub fn open(&self) -> usize {
        lock(&self.shared.state).connections.len()
    }

    /// Connections frozen now.
    pub fn frozen(&self) -> usize {
        lock(&self.shared.state)
            .connections
            .values()
            .filter(|flow| *flow.borrow() == Flow::Frozen)
            .count()
    }
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpProxy")
            .field("addr", &self.addr)
            .field("target", &self.target())
            .field("open", &self.open())
            .field("frozen", &self.frozen())
            .finish()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Closing the channel ends the accept loop; the runtime, dropped
        // with its thread, closes every connection.
        let (commands, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.commands, commands));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn freeze_all(state: &State) {
    for flow in state.connections.values() {
        // Holding a flow's write lock waits for a read or write in progress
        // (see `step`): once this returns, nothing moves.
        flow.send_if_modified(|flow| {
            let open = *flow == Flow::Forward;
            if open {
                *flow = Flow::Frozen;
            }
            open
        });
    }
}

/// The accept loop, until the proxy is dropped.
async fn run(
    listener: std::net::TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    ready: std_mpsc::Sender<io::Result<()>>,
) {
    let mut listener = match TcpListener::from_std(listener) {
        Ok(listener) => Some(listener),
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    enum Event {
        Command(Option<Command>),
        Accepted(io::Result<TcpStream>),
    }
    loop {
        let event = tokio::select! {
            command = commands.recv() => Event::Command(command),
            accepted = accept(listener.as_ref()) => Event::Accepted(accepted),
        };
        match event {
            Event::Command(None) => return,
            Event::Command(Some(Command::Close(done))) => {
                listener = None;
                let _ = done.send(());
            }
            Event::Command(Some(Command::Listen(done))) => {
                let result = match listener {
                    Some(_) => Ok(()),
                    None => TcpListener::bind(addr)
                        .await
                        .map(|l| listener = Some(l)),
                };
                let _ = done.send(result);
            }
            Event::Accepted(Ok(client)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let registered = {
                    let mut state = lock(&shared.state);
                    let flow = match state.mode {
                        Mode::Forward => Flow::Forward,
                        Mode::Blackhole => Flow::Frozen,
                        Mode::Cut => Flow::Closed,
                    };
                    (flow != Flow::Closed).then(|| {
                        let id = state.next_id;
                        state.next_id += 1;
                        let flow = Arc::new(watch::Sender::new(flow));
                        state.connections.insert(id, flow.clone());
                        (id, flow)
                    })
                };
                if let Some((id, flow)) = registered {
                    let connection = Connection {
                        id,
                        shared: shared.clone(),
                    };
                    tokio::spawn(connection.serve(client, flow));
                }
            }
            // A failed accept (e.g. too many open files): try the next one.
            Event::Accepted(Err(_)) => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> io::Result<TcpStream> {
    match listener {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

/// One accepted connection; removes itself from the open ones when dropped
/// (when it ends, or with the runtime).
struct Connection {
    id: u64,
    shared: Arc<Shared>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        lock(&self.shared.state).connections.remove(&self.id);
    }
}

impl Connection {
    async fn serve(self, client: TcpStream, flow: Arc<watch::Sender<Flow>>) {
        // A held connection reaches the target only once let through.
        if wait_until_forwarding(&mut flow.subscribe()).await.is_err() {
            return;
        }
        let target = *lock(&self.shared.target);
        let connect =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target));
        let upstream = tokio::select! {
            connected = connect => match connected {
                Ok(Ok(upstream)) => upstream,
                // The client sees its connection closed, as with no path.
                _ => return,
            },
            // Cut while connecting.
            () = until_closed(flow.subscribe()) => return,
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        tokio::join!(
            pump(&client, &upstream, &flow),
            pump(&upstream, &client, &flow)
        );
        // `self` is dropped here: the connection is no longer open, and the
        // sockets close with this future.
    }
}

/// Waits until `flow` forwards; `Err` once it is closed.
async fn wait_until_forwarding(
    flow: &mut watch::Receiver<Flow>,
) -> Result<(), ()> {
    loop {
        let now = *flow.borrow_and_update();
        match now {
            Flow::Forward => return Ok(()),
            Flow::Closed => return Err(()),
            Flow::Frozen => flow.changed().await.map_err(drop)?,
        }
    }
}

/// Returns once `flow` is closed.
async fn until_closed(mut flow: watch::Receiver<Flow>) {
    while *flow.borrow_and_update() != Flow::Closed {
        if flow.changed().await.is_err() {
            return;
        }
    }
}

/// What one non-blocking read or write did.
enum Step {
    Done(usize),
    /// Not ready after all, or no longer forwarding: wait again.
    Again,
    /// End of stream or an error: the connection ends.
    End,
}

/// One read or write, only while the flow forwards: the flow's read lock is
/// held across it, so a freeze (which takes the write lock) waits for it and
/// none starts after.
fn step(
    flow: &mut watch::Receiver<Flow>,
    io: impl FnOnce() -> io::Result<usize>,
) -> Step {
    let now = flow.borrow_and_update();
    if *now != Flow::Forward {
        return Step::Again;
    }
    match io() {
        Ok(0) => Step::End,
        Ok(n) => Step::Done(n),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Step::Again,
        Err(_) => Step::End,
    }
}

/// Copies `from` to `to` while the flow forwards; when either side ends,
/// closes the whole connection.
async fn pump(from: &TcpStream, to: &TcpStream, flow: &watch::Sender<Flow>) {
    let mut rx = flow.subscribe();
    let mut buffer = vec![0_u8; BUFFER];
    'copy: loop {
        let read = loop {
            if wait_until_forwarding(&mut rx).await.is_err() {
                return;
            }
            tokio::select! {
                ready = from.readable() => if ready.is_err() { break 'copy },
                _ = rx.changed() => continue,
            }
            match step(&mut rx, || from.try_read(&mut buffer)) {
                Step::Done(n) => break n,
                Step::Again => continue,
                Step::End => break 'copy,
            }
        };
        let mut written = 0;
        while written < read {
            if wait_until_forwarding(&mut rx).await.is_err() {
                return;
            }
            tokio::select! {
                ready = to.writable() => if ready.is_err() { break 'copy },
                _ = rx.changed() => continue,
            }
            match step(&mut rx, || to.try_write(&buffer[written..read])) {
                Step::Done(n) => written += n,
                Step::Again => continue,
                Step::End => break 'copy,
            }
        }
    }
    // This direction ended (end of stream or an error): close both.
    flow.send_if_modified(|flow| {
        let open = *flow != Flow::Closed;
        *flow = Flow::Closed;
        open
    });
}
