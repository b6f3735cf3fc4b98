//! Asking every node at once and answering at a quorum: the answers that
//! decide an operation come back to the caller; the nodes still working
//! finish in the background.

use std::future::Future;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::error::Error;
use crate::store::redis::RedisStore;

/// The calls still running when an operation was decided, each with its
/// node's index.
pub(super) type Stragglers<T> = FuturesUnordered<BoxFuture<'static, (usize, T)>>;

/// Starts `op` on every node of `nodes` (with its index) at once and
/// collects answers until `decided(answers so far)` holds or every node
/// answered. Answers come in the order they arrived; the calls still
/// running come back unpolled-to-the-end, for
/// [`in_background`] (dropping them drops the calls).
pub(super) async fn gather<T, F>(
    nodes: impl IntoIterator<Item = (usize, RedisStore)>,
    op: impl Fn(RedisStore) -> F,
    decided: impl Fn(&[(usize, T)]) -> bool,
) -> (Vec<(usize, T)>, Stragglers<T>)
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut running: Stragglers<T> = nodes
        .into_iter()
        .map(|(i, node)| {
            let call = op(node);
            Box::pin(async move { (i, call.await) }) as BoxFuture<'static, (usize, T)>
        })
        .collect();
    let mut answers = Vec::with_capacity(running.len());
    while let Some(answer) = running.next().await {
        answers.push(answer);
        if decided(&answers) {
            break;
        }
    }
    (answers, running)
}

/// Lets the calls still running finish on a task of their own, handing
/// each late answer to `late` (which may await more calls).
pub(super) fn in_background<T, F>(
    mut stragglers: Stragglers<T>,
    late: impl Fn(usize, T) -> F + Send + 'static,
) where
    T: Send + 'static,
    F: Future<Output = ()> + Send,
{
    if stragglers.is_empty() {
        return;
    }
    tokio::spawn(async move {
        while let Some((i, answer)) = stragglers.next().await {
            late(i, answer).await;
        }
    });
}

/// How many answers are `Ok(true)` and how many `Ok(false)`.
pub(super) fn tally<'a>(
    answers: impl IntoIterator<Item = &'a Result<bool, Error>>,
) -> (usize, usize) {
    answers.into_iter().fold((0, 0), |(yes, no), a| match a {
        Ok(true) => (yes + 1, no),
        Ok(false) => (yes, no + 1),
        Err(_) => (yes, no),
    })
}
