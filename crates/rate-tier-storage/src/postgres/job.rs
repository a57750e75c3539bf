//! A call sent to PostgreSQL, owned and run to its end in a task of its own,
//! whatever its caller does: a caller that gave up was answered without
//! the database, so what it charges late is refunded here (rates by the
//! settle function, slots by the release function; windows and periods
//! stay charged), and a reservation that comes back late is cancelled,
//! never sent twice. The task waits [`LATE_ANSWER`] at most. Why: "Late
//! answers" in ARCHITECTURE.md.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_postgres::types::ToSql;

use super::Inner;
use crate::storage::StorageError;

/// How long a task waits for the database once its caller stopped waiting.
const LATE_ANSWER: Duration = Duration::from_secs(5);

/// How a decision's arguments are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// Rates alone, for the one-bucket statement or the check function: 5
    /// per bucket (`T`, `tau`, cost, shadow, max debt).
    Rates,
    /// With a window, a period or a concurrency limit, for the mixed
    /// function: 6 per bucket (tag, a, b, c, cost, shadow; a rate's tag is
    /// 0 and its a, b, c are `T`, `tau` and the max debt; a concurrency
    /// limit's 3, and its c is the slots' id).
    Mixed,
}

/// What a passed decision took from one bucket, as far as it can be given
/// back.
enum Taken {
    /// A rate's `T`, `tau` and max debt: its charge is refunded.
    Rate([i64; 3]),
    /// Slots of a concurrency limit under this id: they are released.
    Slots(i64),
    /// A window or a period: kept (see the module's docs).
    Kept,
}

impl Layout {
    /// The function whose reply it is, after the table's name.
    pub(super) fn function(self) -> &'static str {
        match self {
            Layout::Rates => "check",
            Layout::Mixed => "decide_mixed",
        }
    }

    /// Bucket `i`'s cost and shadow flag, and what a pass took from it.
    fn bucket(self, args: &[i64], i: usize) -> (i64, i64, Taken) {
        match self {
            Layout::Rates => {
                let a = &args[5 * i..5 * i + 5];
                (a[2], a[3], Taken::Rate([a[0], a[1], a[4]]))
            }
            Layout::Mixed => {
                let a = &args[6 * i..6 * i + 6];
                let taken = match a[0] {
                    0 => Taken::Rate([a[1], a[2], a[3]]),
                    3 => Taken::Slots(a[3]),
                    _ => Taken::Kept,
                };
                (a[4], a[5], taken)
            }
        }
    }
}

/// Decides `keys` (their arguments laid out as `layout` says in `args`) in
/// a task; the reply of the function, or why there is none.
pub(super) async fn decide(
    inner: &Arc<Inner>,
    layout: Layout,
    keys: Vec<String>,
    args: Vec<i64>,
) -> Result<Vec<i64>, StorageError> {
    let (answer, answered) = oneshot::channel();
    let task = Arc::clone(inner);
    tokio::spawn(async move {
        let reply = within(task.check(layout, &keys, &args)).await;
        if let Err(Ok(reply)) = answer.send(reply) {
            // Nobody waits: give back what the decision charged.
            refund(&task, layout, keys, &args, &reply).await;
        }
    });
    wait(inner.timeout, answered).await
}

/// Reserves `keys` (their arguments laid out as [`Layout::Rates`] in
/// `args`) for a caller that waits at most `max_wait_us`, in a task: the
/// reservation function's reply (5 numbers per key, then 5), or why there
/// is none. When nobody waits for the reply any more, the reservation is
/// given back.
pub(super) async fn reserve(
    inner: &Arc<Inner>,
    keys: Vec<String>,
    args: Vec<i64>,
    max_wait_us: i64,
) -> Result<Vec<i64>, StorageError> {
    let (answer, answered) = oneshot::channel();
    let task = Arc::clone(inner);
    tokio::spawn(async move {
        let statement = &task.schema.reserve;
        let expected = keys.len().saturating_add(1).saturating_mul(5);
        let params: [&(dyn ToSql + Sync); 3] = [&keys, &args, &max_wait_us];
        let reply = within(task.reply(statement, &params, expected))
            .await
            .and_then(|reply| {
                reply.ok_or_else(|| {
                    StorageError::Protocol(format!(
                        "{statement} returned no row"
                    ))
                })
            });
        if let Err(Ok(reply)) = answer.send(reply) {
            give_back(&task, keys, &args, &reply).await;
        }
    });
    wait(inner.timeout, answered).await
}

/// Settles `keys` (4 arguments each in `args`) in a task.
pub(super) async fn settle(
    inner: &Arc<Inner>,
    keys: Vec<String>,
    args: Vec<i64>,
) -> Result<(), StorageError> {
    run(inner, Call::Settle, keys, args).await.map(drop)
}

/// A call that is applied once sent, whoever waits for it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Call {
    /// `<table>_settle`: 4 arguments per key, 2 numbers per key back.
    Settle,
    /// `<table>_release`: the id and the units per key, the units given
    /// back per key.
    Release,
    /// `<table>_renew`: the id and the lease per key, the units renewed
    /// per key.
    Renew,
    /// `<table>_cancel`: `T`, the cost and the TAT reserved per key, what
    /// was done per key (0 kept, 1 moved back, 2 cleared).
    Cancel,
}

/// Runs `call` over `keys` in a task: its reply, or why there is none.
pub(super) async fn run(
    inner: &Arc<Inner>,
    call: Call,
    keys: Vec<String>,
    args: Vec<i64>,
) -> Result<Vec<i64>, StorageError> {
    let (answer, answered) = oneshot::channel();
    let task = Arc::clone(inner);
    tokio::spawn(async move {
        let (statement, per_key) = match call {
            Call::Settle => (&task.schema.settle, 2),
            Call::Release => (&task.schema.release, 1),
            Call::Renew => (&task.schema.renew, 1),
            Call::Cancel => (&task.schema.cancel, 1),
        };
        let expected = keys.len() * per_key;
        let reply = within(task.call(statement, &keys, &args, expected)).await;
        let _ = answer.send(reply);
    });
    wait(inner.timeout, answered).await
}

async fn within<T>(
    call: impl Future<Output = Result<T, StorageError>>,
) -> Result<T, StorageError> {
    match tokio::time::timeout(LATE_ANSWER, call).await {
        Ok(reply) => reply,
        Err(_) => Err(StorageError::Timeout(LATE_ANSWER)),
    }
}

async fn wait<T>(
    bound: Duration,
    answered: oneshot::Receiver<Result<T, StorageError>>,
) -> Result<T, StorageError> {
    match tokio::time::timeout(bound, answered).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(_)) => Err(StorageError::Protocol(
            "the task of a PostgreSQL call ended without an answer".into(),
        )),
        Err(_) => Err(StorageError::Timeout(bound)),
    }
}

/// Gives back what a decision nobody saw took: when it passed, each bucket
/// charged its cost (peeks charge nothing); a refused one charged nothing.
/// Its rates are refunded and its slots released; a window or a period
/// stays charged (see the module's docs).
async fn refund(
    inner: &Inner,
    layout: Layout,
    keys: Vec<String>,
    args: &[i64],
    reply: &[i64],
) {
    // Refused: an enforced bucket refused, and nothing was charged.
    let refused = (0..keys.len())
        .any(|i| reply[4 * i] == 0 && layout.bucket(args, i).1 == 0);
    if refused {
        return;
    }
    let (mut refund_keys, mut refund_args) = (Vec::new(), Vec::new());
    let (mut slot_keys, mut slot_args) = (Vec::new(), Vec::new());
    for (i, key) in keys.into_iter().enumerate() {
        let (cost, _, taken) = layout.bucket(args, i);
        if cost == 0 || reply[4 * i] != 1 {
            continue;
        }
        match taken {
            Taken::Rate([t, tau, debt]) => {
                refund_keys.push(key);
                refund_args.extend([t, tau, -cost, debt]);
            }
            Taken::Slots(id) => {
                slot_keys.push(key);
                slot_args.extend([id, cost]);
            }
            // A window or a period: over-charged, never forgiven.
            Taken::Kept => {}
        }
    }
    // Best effort: a refund that fails leaves the charge (as Redis's), a
    // release that fails leaves the slots until their lease ends.
    if !refund_keys.is_empty() {
        let expected = refund_keys.len() * 2;
        let _ = within(inner.call(
            &inner.schema.settle,
            &refund_keys,
            &refund_args,
            expected,
        ))
        .await;
    }
    if !slot_keys.is_empty() {
        let expected = slot_keys.len();
        let _ = within(inner.call(
            &inner.schema.release,
            &slot_keys,
            &slot_args,
            expected,
        ))
        .await;
    }
}

/// Gives back what a reservation nobody saw took: reserved, each bucket
/// with a cost that passed at the slot was charged (a shadow that refused
/// there wrote at most a capped TAT, a repair); not reserved, nothing was.
/// Best effort: a cancel that fails leaves the slot taken.
async fn give_back(
    inner: &Inner,
    keys: Vec<String>,
    args: &[i64],
    reply: &[i64],
) {
    let n = keys.len();
    if reply.get(5 * n) != Some(&1) {
        return;
    }
    let (mut cancel_keys, mut cancel_args) = (Vec::new(), Vec::new());
    for (i, key) in keys.into_iter().enumerate() {
        let (Some(&[t, _, cost, ..]), Some(&[allowed, .., tat])) =
            (args.get(5 * i..5 * i + 5), reply.get(5 * i..5 * i + 5))
        else {
            continue;
        };
        if cost > 0 && allowed == 1 && tat > 0 {
            cancel_keys.push(key);
            cancel_args.extend([t, cost, tat]);
        }
    }
    if !cancel_keys.is_empty() {
        let expected = cancel_keys.len();
        let _ = within(inner.call(
            &inner.schema.cancel,
            &cancel_keys,
            &cancel_args,
            expected,
        ))
        .await;
    }
}
