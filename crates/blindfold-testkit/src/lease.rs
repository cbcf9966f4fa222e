//! The lease conformance suite: one set of checks that every [`LeaseStore`] backend passes.
//!
//! [`run`] takes several handles onto the *same* leases (for a backend reached over the
//! network, each opened on its own with [`blindfold_store::open_lease_store`], so that races
//! go through the backend and not through one client; for `memory:`, clones of one handle) on
//! a store where no lease was taken yet, and checks every contract in the [`LeaseStore`] docs:
//! generations, refusal while live, expiry (with a short ttl and a sleep of real time, since
//! the backends' records carry wall-clock deadlines), fencing, release, inspection, hostile
//! names, and a race of [`RACERS`] concurrent acquires of a free lease that exactly one wins.
//! Each failed check panics with a message naming the check (`lease conformance check "…"
//! failed: …`).

use std::sync::Arc;
use std::time::Duration;

use blindfold_store::{LeaseInfo, LeaseStore, StoreError};

/// Number of concurrent acquires in the race check.
pub const RACERS: usize = 8;
/// The short ttl of the expiry checks.
pub const SHORT_TTL: Duration = Duration::from_millis(300);
/// The ttl of leases that must stay live for the whole check.
const LONG_TTL: Duration = Duration::from_secs(60);

fn fail(check: &str, msg: impl std::fmt::Display) -> ! {
    panic!("lease conformance check {check:?} failed: {msg}")
}

fn ok<T>(check: &str, r: Result<T, StoreError>) -> T {
    r.unwrap_or_else(|e| fail(check, format!("unexpected error: {e}")))
}

fn held(check: &str, r: Result<LeaseInfo, StoreError>, by: &str, generation: u64) {
    match r {
        Err(StoreError::LeaseHeld { holder, generation: g, expires_in, .. }) => {
            if holder != by || g != generation {
                fail(
                    check,
                    format!("refused naming {holder:?} gen {g}, not {by:?} gen {generation}"),
                );
            }
            if expires_in.is_zero() || expires_in > LONG_TTL {
                fail(check, format!("expires_in {expires_in:?} is outside (0, {LONG_TTL:?}]"));
            }
        }
        other => fail(check, format!("expected LeaseHeld by {by:?}, got {other:?}")),
    }
}

fn lost(check: &str, r: Result<LeaseInfo, StoreError>, current_generation: u64) {
    match r {
        Err(StoreError::LeaseLost { current_generation: g, .. }) if g == current_generation => {}
        other => {
            fail(check, format!("expected LeaseLost (now gen {current_generation}), got {other:?}"))
        }
    }
}

fn expect(check: &str, got: &LeaseInfo, holder: &str, generation: u64) {
    if got.holder != holder || got.generation != generation {
        fail(check, format!("got {got:?}, expected holder {holder:?} generation {generation}"));
    }
}

/// Runs every check on `handles` (at least two handles onto the same, untouched leases).
/// Takes a few seconds: two checks wait for a [`SHORT_TTL`] lease to expire.
pub async fn run(handles: &[Arc<dyn LeaseStore>]) {
    assert!(handles.len() >= 2, "the lease suite needs two handles onto the same leases");
    let (a, b) = (&handles[0], &handles[1]);

    let check = "a lease never taken is inspected as None";
    if let Some(found) = ok(check, a.inspect("never").await) {
        fail(check, format!("found {found:?}"));
    }

    let check = "the first acquire gets generation 1";
    let first = ok(check, a.acquire("first", "holder-a", LONG_TTL).await);
    expect(check, &first, "holder-a", 1);
    let now = blindfold_store::lease::system_clock_ms();
    if !first.is_live(now) || first.expires_unix_ms > now + LONG_TTL.as_millis() as u64 {
        fail(check, format!("expires at {} (now {now})", first.expires_unix_ms));
    }

    let check = "inspect reports the holder, through another handle";
    match ok(check, b.inspect("first").await) {
        Some(info) if info == first => {}
        other => fail(check, format!("found {other:?}, expected {first:?}")),
    }

    let check = "a second holder is refused while the lease is live";
    held(check, b.acquire("first", "holder-b", LONG_TTL).await, "holder-a", 1);
    let check = "the same holder name is refused too while the lease is live";
    held(check, b.acquire("first", "holder-a", LONG_TTL).await, "holder-a", 1);

    let check = "renew extends the lease and keeps the generation";
    let renewed = ok(check, a.renew("first", 1, LONG_TTL).await);
    expect(check, &renewed, "holder-a", 1);
    if renewed.expires_unix_ms < first.expires_unix_ms {
        fail(check, format!("{renewed:?} expires before {first:?}"));
    }

    let check = "renew of a generation that does not exist is refused";
    lost(check, a.renew("first", 2, LONG_TTL).await, 1);
    lost(check, a.renew("never", 1, LONG_TTL).await, 0);

    let check = "after expiry a second holder gets the next generation";
    let short = ok(check, a.acquire("expiry", "holder-a", SHORT_TTL).await);
    expect(check, &short, "holder-a", 1);
    held(check, b.acquire("expiry", "holder-b", LONG_TTL).await, "holder-a", 1);
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(150)).await;
    let second = ok(check, b.acquire("expiry", "holder-b", LONG_TTL).await);
    expect(check, &second, "holder-b", 2);

    let check = "the fenced holder's renew fails with LeaseLost";
    lost(check, a.renew("expiry", 1, LONG_TTL).await, 2);
    let check = "the fenced holder's release does nothing";
    ok(check, a.release("expiry", 1).await);
    match ok(check, b.inspect("expiry").await) {
        Some(info) if info == second => {}
        other => fail(check, format!("found {other:?}, expected {second:?}")),
    }
    held(check, a.acquire("expiry", "holder-a", LONG_TTL).await, "holder-b", 2);

    let check = "an expired lease nobody took is renewed with the same generation";
    ok(check, a.acquire("lapse", "holder-a", SHORT_TTL).await);
    tokio::time::sleep(SHORT_TTL + Duration::from_millis(150)).await;
    let revived = ok(check, a.renew("lapse", 1, LONG_TTL).await);
    expect(check, &revived, "holder-a", 1);
    held(check, b.acquire("lapse", "holder-b", LONG_TTL).await, "holder-a", 1);

    let check = "release lets the next acquire succeed at once with generation + 1";
    ok(check, a.acquire("release", "holder-a", LONG_TTL).await);
    ok(check, a.release("release", 1).await);
    match ok(check, b.inspect("release").await) {
        Some(info) if info.generation == 1 && info.is_released() => {}
        other => fail(check, format!("after release found {other:?}")),
    }
    let next = ok(check, b.acquire("release", "holder-b", LONG_TTL).await);
    expect(check, &next, "holder-b", 2);
    let check = "renew after release (and takeover) is refused";
    lost(check, a.renew("release", 1, LONG_TTL).await, 2);
    ok(check, b.release("release", 2).await);
    lost(check, b.renew("release", 2, LONG_TTL).await, 2);
    let check = "release of a released or never-taken lease does nothing";
    ok(check, b.release("release", 2).await);
    ok(check, a.release("never", 1).await);
    if let Some(found) = ok(check, a.inspect("never").await) {
        fail(check, format!("release created {found:?}"));
    }
    let check = "generations keep growing across holders";
    let third = ok(check, a.acquire("release", "holder-a", LONG_TTL).await);
    expect(check, &third, "holder-a", 3);

    race(handles, "race", 1).await;
    let winner = ok("race", handles[0].inspect("race").await).unwrap();
    ok("race", handles[0].release("race", winner.generation).await);
    race(handles, "race", 2).await;

    hostile(a.as_ref()).await;
}

/// [`RACERS`] concurrent acquires of a free lease through all handles: exactly one wins, with
/// `generation`, and every other is refused naming the winner.
async fn race(handles: &[Arc<dyn LeaseStore>], name: &str, generation: u64) {
    let check = "of concurrent acquires of a free lease exactly one wins";
    let attempts = (0..RACERS).map(|i| {
        let handle = Arc::clone(&handles[i % handles.len()]);
        async move { handle.acquire(name, &format!("racer-{i}"), LONG_TTL).await }
    });
    let results = futures::future::join_all(attempts).await;
    let winners: Vec<&LeaseInfo> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    let [winner] = winners.as_slice() else {
        fail(check, format!("{} winners: {winners:?}", winners.len()));
    };
    if winner.generation != generation {
        fail(check, format!("the winner got {winner:?}, expected generation {generation}"));
    }
    for r in &results {
        match r {
            Ok(_) => {}
            Err(StoreError::LeaseHeld { holder, generation: g, .. })
                if holder == &winner.holder && *g == generation => {}
            Err(e) => fail(check, format!("a loser got {e:?}, not LeaseHeld by {winner:?}")),
        }
    }
    match ok(check, handles[1].inspect(name).await) {
        Some(info) if &info == *winner => {}
        other => fail(check, format!("the store records {other:?}, the winner is {winner:?}")),
    }
}

/// Names and holders from outside are bounded and checked.
async fn hostile(store: &dyn LeaseStore) {
    let check = "hostile lease names are refused";
    let long = "n".repeat(300);
    for name in ["", "../escape", "a/b", ".hidden", "a\nb", "spa ce", long.as_str()] {
        match store.acquire(name, "holder", LONG_TTL).await {
            Err(StoreError::InvalidName { .. }) => {}
            other => fail(check, format!("name {name:?} gave {other:?}")),
        }
        if !matches!(store.inspect(name).await, Err(StoreError::InvalidName { .. })) {
            fail(check, format!("inspect of {name:?} was not refused"));
        }
    }
    let check = "hostile holders and ttls are refused";
    let long = "h".repeat(blindfold_store::MAX_HOLDER_LEN + 1);
    for holder in ["", "new\nline", "nul\0", "esc\u{1b}[2J", long.as_str()] {
        match store.acquire("hostile", holder, LONG_TTL).await {
            Err(StoreError::InvalidRequest(msg)) if msg.len() < 512 => {}
            other => fail(check, format!("holder {holder:?} gave {other:?}")),
        }
    }
    match store.acquire("hostile", "holder", Duration::ZERO).await {
        Err(StoreError::InvalidRequest(_)) => {}
        other => fail(check, format!("a zero ttl gave {other:?}")),
    }
    if let Some(found) = ok(check, store.inspect("hostile").await) {
        fail(check, format!("a refused acquire left {found:?}"));
    }
}
