//! Batches spread over the machine's cores with scoped threads (no thread pool to configure).

use std::thread;

/// Below this many items a batch runs on the calling thread: each item costs milliseconds, so
/// two items already pay for a thread, but one never does.
const MIN_PARALLEL: usize = 2;

/// `items.iter().map(f).collect()`, computed on up to `available_parallelism` threads in
/// contiguous chunks; the output keeps the input's order.
pub(crate) fn par_map<T, U, F>(items: &[T], f: F) -> Vec<U>
where
    T: Sync,
    U: Send,
    F: Fn(&T) -> U + Sync,
{
    let threads = thread::available_parallelism().map_or(1, |n| n.get());
    if items.len() < MIN_PARALLEL || threads < 2 {
        return items.iter().map(&f).collect();
    }
    let chunk = items.len().div_ceil(threads.min(items.len()));
    let f = &f;
    thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<U>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order() {
        let items: Vec<u32> = (0..1000).collect();
        assert_eq!(par_map(&items, |x| x * 2), items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(par_map(&items[..1], |x| x + 1), vec![1]);
        assert!(par_map(&items[..0], |x| x + 1).is_empty());
    }

    #[test]
    fn spreads_over_threads_when_cores_allow() {
        let items: Vec<u32> = (0..8).collect();
        let ids = par_map(&items, |_| thread::current().id());
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        if cores >= 2 {
            assert!(distinct.len() >= 2, "{} thread(s) for {cores} cores", distinct.len());
        } else {
            assert_eq!(distinct.len(), 1);
        }
    }
}
