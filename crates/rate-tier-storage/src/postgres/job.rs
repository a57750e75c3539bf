//! A call sent to PostgreSQL, owned and run to its end in a task of its own,
//! whatever its caller does.
//!
//! A caller that stops waiting (its timeout fired, or its future was
//! dropped) answered without PostgreSQL: a fallback decided locally, or a
//! policy did. What the database then decides for it must not stay charged,
//! or the request is charged twice. So the decision runs in a task: its
//! caller waits for it within the store's timeout, and when the caller is
//! gone by the time the answer comes, the task refunds every charge the
//! decision made, as the Redis store does. A settlement is run to its end
//! the same way: once sent, it is applied whether or not anyone waits.
//!
//! The task waits [`LATE_ANSWER`] at most: a database that never answers
//! leaves a decision unknown (it may have been charged, and nothing can
//! tell).

use std::sync::Arc;
use std::time::Duration;

use gcra_core::{Adjust, Quota};
use tokio::sync::oneshot;

use super::Inner;
use crate::storage::StorageError;

/// How long a task waits for the database once its caller stopped waiting.
const LATE_ANSWER: Duration = Duration::from_secs(5);

/// The signed units of an adjustment, as the settle function takes them.
pub(super) fn units(adjust: Adjust) -> i64 {
    match adjust {
        Adjust::Charge(units) => i64::from(units),
        Adjust::Refund(units) => -i64::from(units),
    }
}

/// The settle function's 4 arguments of one bucket.
pub(super) fn settle_args(
    quota: Quota,
    units: i64,
) -> Result<[i64; 4], StorageError> {
    let exact = |v: u64| {
        i64::try_from(v).map_err(|_| {
            StorageError::Protocol(format!(
                "argument {v} is beyond PostgreSQL's int8"
            ))
        })
    };
    Ok([
        exact(quota.emission_interval_us())?,
        exact(quota.burst_offset_us())?,
        units,
        exact(quota.max_debt_us())?,
    ])
}

/// Decides `keys` (their 5 arguments each in `args`) in a task; the reply
/// of the check function, or why there is none.
pub(super) async fn decide(
    inner: &Arc<Inner>,
    keys: Vec<String>,
    args: Vec<i64>,
) -> Result<Vec<i64>, StorageError> {
    let (answer, answered) = oneshot::channel();
    let task = Arc::clone(inner);
    tokio::spawn(async move {
        let reply = within(task.check(&keys, &args)).await;
        if let Err(Ok(reply)) = answer.send(reply) {
            // Nobody waits: give back what the decision charged.
            refund(&task, keys, &args, &reply).await;
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
    let (answer, answered) = oneshot::channel();
    let task = Arc::clone(inner);
    tokio::spawn(async move {
        let expected = keys.len() * 2;
        let reply =
            within(task.call(&task.schema.settle, &keys, &args, expected))
                .await;
        let _ = answer.send(reply.map(drop));
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

/// Refunds the charges of a decision nobody saw: when it passed, each
/// bucket charged its cost (peeks charge nothing); a refused one charged
/// nothing.
async fn refund(inner: &Inner, keys: Vec<String>, args: &[i64], reply: &[i64]) {
    let charged = |i: usize| args[5 * i + 2] > 0 && reply[4 * i] == 1;
    // Refused: an enforced bucket refused, and nothing was charged.
    let refused =
        (0..keys.len()).any(|i| reply[4 * i] == 0 && args[5 * i + 3] == 0);
    if refused {
        return;
    }
    let mut refund_keys = Vec::new();
    let mut refund_args = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        if charged(i) {
            refund_keys.push(key);
            // T, tau, -cost, max debt.
            refund_args.extend([
                args[5 * i],
                args[5 * i + 1],
                -args[5 * i + 2],
                args[5 * i + 4],
            ]);
        }
    }
    if refund_keys.is_empty() {
        return;
    }
    let expected = refund_keys.len() * 2;
    // Best effort: a refund that fails leaves the charge (as Redis's).
    let _ = within(inner.call(
        &inner.schema.settle,
        &refund_keys,
        &refund_args,
        expected,
    ))
    .await;
}
