//! Rebuilding a lost balancer's state directory from a snapshot of its checkpoint
//! ([`Balancer::recover`], run by `blindfold recover --nodes …`).
//!
//! # The problem
//!
//! The snapshot's checkpoint maps each block to a place `(node, local id)` or holds it in the
//! eviction cache. The lost balancer may have served after the snapshot: each access took a
//! block out of its place and freed the place, which a later eviction gave to another block.
//! So a snapshot place may now hold another block, and the nodes have seen the lost
//! balancer's reads since the snapshot: reading a block again where it was read from would
//! link accesses across the loss.
//!
//! # What recover does
//!
//! 1. Connects to every node of the snapshot's cluster (its node records name them) and
//!    **reads every local id of every node**, node by node and id by id, in requests of at most
//!    [`MAX_BLOCKS_PER_RPC`] ids. The order depends on nothing secret. A block the snapshot
//!    places is kept if the digest recorded beside its place ([`BlockDigestKey`]) matches the
//!    data read there; otherwise it is lost. A block placed without a digest (by a version that
//!    kept none) cannot be verified and is lost too, and counted apart. Blocks in the
//!    snapshot's cache are kept as they are.
//! 2. Draws for each kept block a fresh, uniformly random node and a free local id there (never
//!    its snapshot place); a block whose node is full stays in the cache, assigned to that
//!    node. This *plan* (the new checkpoint and the data of every placed block) is sealed and
//!    made durable in `recover-plan/` before any node is written.
//! 3. **Writes every local id of every node** in the same fixed order: a kept block where the
//!    plan puts it, a dummy block of random bytes everywhere else. Commits every node.
//! 4. Writes the new checkpoint (every place new, each with its digest under a fresh digest
//!    key), an empty redo log and `nodes.json`. The plan is removed when the balancer is next
//!    opened.
//!
//! After it, every block sits at a place drawn after the loss, and the nodes saw one full
//! sweep of reads and one of writes whatever the blocks were.
//!
//! # Crash safety
//!
//! Before the plan is durable, nothing was written: a new run starts over (reading every id
//! again, one more sweep of the same shape). Once it is durable, a new run takes the plan and
//! repeats the whole write sweep (a partly written node is finished; a finished one is written
//! again with the same blocks at the same ids). The plan holds the data of every kept block,
//! as the balancer's memory does while recover runs.
//!
//! # Security
//!
//! The nodes see two full sweeps, reads then writes (more if a run is repeated), each the same
//! for every content of the cluster. The plan in the state directory is sealed under the
//! master key like the checkpoint.

use std::collections::HashMap;
use std::path::Path;

use blindfold_crypto::{BlockDigestKey, MasterKey, StateSealer};
use blindfold_proxy::state_file;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::balancer::{
    decode_checkpoint, expect_balancer_checkpoint, write_nodes_file, Checkpoint, Digest,
    NodeRecord, CHECKPOINT_MAGIC, DUMMY_IDS,
};
use crate::certs::ClusterTls;
use crate::client::NodeClient;
use crate::wire::{Access, MAX_BLOCKS_PER_RPC};
use crate::{Balancer, NodeError};

pub use crate::balancer::RECOVER_PLAN_DIR;
const PLAN_MAGIC: &[u8; 8] = b"BFLBRP01";

/// What a recover found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Blocks kept: found intact at their snapshot place, or in the snapshot's cache.
    pub blocks_found: u64,
    /// Blocks the snapshot had written whose data is gone (their place holds other data, or
    /// they cannot be verified), sorted.
    pub lost: Vec<u64>,
    /// Of [`Recovered::lost`]: blocks placed without a digest (state of an older version).
    pub unverifiable: u64,
    /// Local ids read (all of every node; 0 when an interrupted recover was resumed).
    pub ids_read: u64,
    /// Local ids written (all of every node).
    pub ids_written: u64,
    /// Kept blocks left in the eviction cache because the node drawn for them was full.
    pub cached: u64,
    /// Whether the plan of an interrupted recover was taken up.
    pub resumed: bool,
}

impl Recovered {
    /// One line for the operator.
    pub fn summary(&self) -> String {
        let mut s = if self.resumed {
            format!(
                "took up an interrupted recover's plan and wrote all {} local ids of the nodes \
                 again",
                self.ids_written
            )
        } else {
            format!(
                "read all {} local ids of the nodes and wrote them again, every block at a \
                 fresh random place",
                self.ids_read
            )
        };
        if self.cached > 0 {
            s.push_str(&format!(" ({} blocks wait in the balancer's cache)", self.cached));
        }
        if !self.lost.is_empty() {
            s.push_str(&format!(
                "; {} blocks are lost: their place no longer holds them (the gateway served after \
                 its last clean stop)",
                self.lost.len()
            ));
            if self.unverifiable > 0 {
                s.push_str(&format!(
                    " or, for {} of them, was recorded by an older blindfold without the digest \
                     that would prove it does",
                    self.unverifiable
                ));
            }
        }
        s
    }
}

/// The rebuild step of a gateway's `recover` over the nodes at `urls`: called with the
/// balancer's state directory, the snapshot's checkpoint bytes and the key. `progress` hears
/// what is being done.
pub fn rebuild_fn(
    urls: Vec<String>,
    tls: ClusterTls,
    progress: std::sync::Arc<dyn Fn(&str) + Send + Sync>,
) -> impl FnOnce(
    std::path::PathBuf,
    Vec<u8>,
    std::sync::Arc<MasterKey>,
) -> futures::future::BoxFuture<'static, blindfold_proxy::Result<Recovered>>
       + Send {
    move |dir, snapshot, key| {
        Box::pin(async move {
            Balancer::recover(&dir, &snapshot, &urls, &tls, &key, &*progress)
                .await
                .map_err(Into::into)
        })
    }
}

/// Where a test can cut a recover short, as a crash there would.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoverCut {
    /// The plan is durable; no node is written yet.
    AfterPlan,
    /// The first node is written (not committed); the others are not.
    MidWrite,
    /// Every node is written and committed; the new checkpoint is not written.
    AfterCommit,
}

#[derive(Serialize, Deserialize)]
struct Plan {
    /// The checkpoint to write at the end.
    ckpt: Checkpoint,
    /// The data of `ckpt.placed`, in its order.
    data: Vec<Vec<u8>>,
    lost: Vec<u64>,
    unverifiable: u64,
    found: u64,
    ids_read: u64,
}

impl Balancer {
    /// Rebuilds the state directory `dir` of a lost balancer from `snapshot`, the checkpoint
    /// file bytes of its last clean stop, over the nodes at `urls` (see [`crate::recover`]).
    /// `progress` hears what is being done. Open the result with [`Balancer::open`].
    pub async fn recover(
        dir: &Path,
        snapshot: &[u8],
        urls: &[String],
        tls: &ClusterTls,
        key: &MasterKey,
        progress: &(dyn Fn(&str) + Send + Sync),
    ) -> Result<Recovered, NodeError> {
        recover_until(dir, snapshot, urls, tls, key, None, None, progress).await
    }
}

fn config(m: impl Into<String>) -> NodeError {
    NodeError::Config(m.into())
}

/// [`Balancer::recover`] with a seeded randomness and a place to stop as a crash would (tests).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub async fn recover_until(
    dir: &Path,
    snapshot: &[u8],
    urls: &[String],
    tls: &ClusterTls,
    key: &MasterKey,
    seed: Option<u64>,
    cut: Option<RecoverCut>,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Recovered, NodeError> {
    let cut_at = |at: RecoverCut| -> Result<(), NodeError> {
        if cut == Some(at) {
            return Err(config(format!("simulated crash at {at:?}")));
        }
        Ok(())
    };
    expect_balancer_checkpoint(snapshot).map_err(config)?;
    let sealer = StateSealer::new(key);
    let ckpt = decode_checkpoint(snapshot, &sealer)
        .map_err(|m| config(format!("the snapshot's balancer checkpoint: {m}")))?;
    let nodes = connect(urls, tls, &ckpt).await?;
    let mut rng = ChaCha20Rng::seed_from_u64(seed.unwrap_or_else(rand::random));
    blindfold_proxy::make_private(dir)?;
    let plan_dir = dir.join(RECOVER_PLAN_DIR);
    let earlier = match std::fs::read(plan_dir.join(state_file::CHECKPOINT)) {
        Ok(buf) => Some(
            state_file::decode_checkpoint::<Plan>(&buf, PLAN_MAGIC, &sealer)
                .map_err(|m| config(format!("{}: {m}", plan_dir.display())))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(NodeError::Io { path: plan_dir, source: e }),
    };
    let (plan, resumed) = match earlier {
        Some(plan) => {
            progress(
                "taking up the plan of a recover that did not finish: writing the nodes again",
            );
            (plan, true)
        }
        None => {
            // What an earlier run left before its plan was durable is not in use: start over.
            for f in [state_file::CHECKPOINT, state_file::REDO_LOG, crate::balancer::NODES_FILE] {
                match std::fs::remove_file(dir.join(f)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(NodeError::Io { path: dir.join(f), source: e })
                    }
                    _ => {}
                }
            }
            let plan = read_and_plan(&nodes, &ckpt, &mut rng, progress).await?;
            make_dir(&plan_dir)?;
            state_file::write_checkpoint_as(&plan_dir, PLAN_MAGIC, &plan, &sealer)?;
            (plan, false)
        }
    };
    cut_at(RecoverCut::AfterPlan)?;
    let ids_written = write_all(&nodes, &plan, &mut rng, cut, progress).await?;
    for c in &nodes {
        let instance = c.commit().await?;
        check_instance(c, instance)?;
    }
    cut_at(RecoverCut::AfterCommit)?;
    state_file::write_checkpoint_as(dir, CHECKPOINT_MAGIC, &plan.ckpt, &sealer)?;
    let log = state_file::open_log(dir)?;
    state_file::empty_log(&log, dir)?;
    let held: Vec<u64> = nodes.iter().map(|c| c.info().blocks).collect();
    write_nodes_file(dir, &nodes, &held)?;
    Ok(Recovered {
        blocks_found: plan.found,
        lost: plan.lost,
        unverifiable: plan.unverifiable,
        ids_read: if resumed { 0 } else { plan.ids_read },
        ids_written,
        cached: plan.ckpt.cached.len() as u64,
        resumed,
    })
}

fn make_dir(dir: &Path) -> Result<(), NodeError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(NodeError::Io { path: dir.to_path_buf(), source: e })
        }
        _ => Ok(()),
    }
}

/// Connects to `urls` and returns the clients in the order of the checkpoint's node records,
/// or says which node is missing or foreign.
async fn connect(
    urls: &[String],
    tls: &ClusterTls,
    ckpt: &Checkpoint,
) -> Result<Vec<NodeClient>, NodeError> {
    if urls.is_empty() {
        return Err(config("--nodes names no node"));
    }
    let clients = futures::future::try_join_all(
        urls.iter().enumerate().map(|(i, u)| NodeClient::connect(u, i, tls)),
    )
    .await?;
    for (i, a) in clients.iter().enumerate() {
        if let Some(b) = clients[..i].iter().find(|b| b.name() == a.name()) {
            return Err(config(format!(
                "{} and {} both proved to be {}: give each node of the cluster once",
                b.url(),
                a.url(),
                a.name()
            )));
        }
        if ckpt.nodes.iter().all(|r| r.id != a.info().id) {
            return Err(config(format!(
                "node {} ({}) is not one of the snapshot's cluster's {} nodes",
                a.url(),
                hex::encode(a.info().id),
                ckpt.nodes.len()
            )));
        }
    }
    let mut ordered = Vec::with_capacity(ckpt.nodes.len());
    for NodeRecord { id, blocks } in &ckpt.nodes {
        let Some(c) = clients.iter().find(|c| c.info().id == *id) else {
            return Err(config(format!(
                "node {} of the snapshot's cluster is not among --nodes (give every node of \
                 the cluster, in any order)",
                hex::encode(id)
            )));
        };
        // More than at the snapshot: a growth that made room on the nodes before the gateway
        // was lost; every local id is swept anyway.
        if c.info().blocks < *blocks || c.info().blocks <= DUMMY_IDS {
            return Err(config(format!(
                "node {} holds {} blocks, fewer than the {blocks} it had at the snapshot: it \
                 does not hold the cluster's data (was its data directory replaced?)",
                c.url(),
                c.info().blocks
            )));
        }
        if c.info().block_size != ckpt.block_size {
            return Err(config(format!(
                "node {} serves blocks of {} bytes, the snapshot's balancer {}",
                c.url(),
                c.info().block_size,
                ckpt.block_size
            )));
        }
        ordered.push(c.clone());
    }
    Ok(ordered)
}

fn check_instance(c: &NodeClient, instance: u64) -> Result<(), NodeError> {
    if instance != c.info().instance {
        return Err(config(format!(
            "node {} restarted while recover ran (it may have lost writes it had not \
             committed): run the same recover again",
            c.url()
        )));
    }
    Ok(())
}

/// A place: node and local id.
type Place = (u32, u64);

/// A block recover keeps: its data and its snapshot place (none if it was cached).
#[derive(Clone)]
struct Kept {
    block: u64,
    data: Vec<u8>,
    was: Option<Place>,
}

/// Reads every local id of every node, keeps the blocks whose digest matches, and draws the
/// new places.
async fn read_and_plan(
    nodes: &[NodeClient],
    ckpt: &Checkpoint,
    rng: &mut ChaCha20Rng,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<Plan, NodeError> {
    let old_key = BlockDigestKey::from_bytes(ckpt.digest_key);
    let n = nodes.len();
    let mut wanted: HashMap<Place, (u64, Digest)> = HashMap::new();
    for &(b, node, local, digest) in &ckpt.placed {
        if node as usize >= n || local >= nodes[node as usize].info().blocks || b >= ckpt.blocks {
            return Err(config(
                "the snapshot's balancer checkpoint places a block outside the nodes",
            ));
        }
        wanted.insert((node, local), (b, digest));
    }
    let mut kept: Vec<Kept> = Vec::new();
    let mut lost = Vec::new();
    let mut unverifiable = 0u64;
    let mut ids_read = 0u64;
    for (i, c) in nodes.iter().enumerate() {
        let total = c.info().blocks;
        progress(&format!("reading node {} of {n} ({}): {total} local ids", i + 1, c.url()));
        let mut at = 0u64;
        while at < total {
            let end = (at + MAX_BLOCKS_PER_RPC as u64).min(total);
            let reads: Vec<u64> = (at..end).collect();
            let (instance, blocks) = c.access(&Access { reads, writes: Vec::new() }).await?;
            check_instance(c, instance)?;
            if blocks.len() as u64 != end - at {
                return Err(config(format!(
                    "node {} answered a read with too few blocks",
                    c.url()
                )));
            }
            for (local, data) in (at..end).zip(blocks) {
                let Some(&(b, digest)) = wanted.get(&(i as u32, local)) else { continue };
                match digest {
                    Some(d) if old_key.matches(b, &data, &d) => {
                        kept.push(Kept { block: b, data, was: Some((i as u32, local)) })
                    }
                    Some(_) => lost.push(b),
                    None => {
                        unverifiable += 1;
                        lost.push(b);
                    }
                }
            }
            ids_read += end - at;
            at = end;
        }
    }
    for (b, _, data) in &ckpt.cached {
        kept.push(Kept { block: *b, data: data.clone(), was: None });
    }
    kept.sort_unstable_by_key(|k| k.block);
    lost.sort_unstable();
    let found = kept.len() as u64;
    // Fresh nodes, then free local ids in a random order on each.
    let mut per_node: Vec<Vec<Kept>> = vec![Vec::new(); n];
    for k in kept {
        per_node[rng.gen_range(0..n)].push(k);
    }
    let new_key = BlockDigestKey::generate().map_err(|e| config(e.to_string()))?;
    let mut placed = Vec::new();
    let mut data = Vec::new();
    let mut cached = Vec::new();
    for (q, blocks) in per_node.into_iter().enumerate() {
        let mut ids: Vec<u64> = (0..nodes[q].info().blocks - DUMMY_IDS).collect();
        ids.shuffle(rng);
        let mut next = 0usize;
        for Kept { block: b, data: d, was } in blocks {
            if next >= ids.len() {
                cached.push((b, q as u32, d));
                continue;
            }
            // Never the place the block had: the lost balancer may have read it there.
            if was == Some((q as u32, ids[next])) && next + 1 < ids.len() {
                ids.swap(next, next + 1);
            }
            let local = ids[next];
            next += 1;
            placed.push((b, q as u32, local, Some(new_key.digest(b, &d))));
            data.push(d);
        }
    }
    Ok(Plan {
        ckpt: Checkpoint {
            blocks: ckpt.blocks,
            block_size: ckpt.block_size,
            evictions: ckpt.evictions,
            // What each node holds now (more than at the snapshot after a growth).
            nodes: nodes
                .iter()
                .map(|c| NodeRecord { id: c.info().id, blocks: c.info().blocks })
                .collect(),
            placed,
            cached,
            digest_key: *new_key.expose_bytes(),
        },
        data,
        lost,
        unverifiable,
        found,
        ids_read,
    })
}

/// Writes every local id of every node: the plan's blocks at their places, random bytes
/// everywhere else. Returns the ids written.
async fn write_all(
    nodes: &[NodeClient],
    plan: &Plan,
    rng: &mut ChaCha20Rng,
    cut: Option<RecoverCut>,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<u64, NodeError> {
    let at_place: HashMap<(u32, u64), usize> =
        plan.ckpt.placed.iter().enumerate().map(|(i, &(_, q, l, _))| ((q, l), i)).collect();
    let bs = plan.ckpt.block_size as usize;
    let mut written = 0u64;
    for (i, c) in nodes.iter().enumerate() {
        if i == 1 && cut == Some(RecoverCut::MidWrite) {
            return Err(config("simulated crash at MidWrite"));
        }
        let total = c.info().blocks;
        progress(&format!(
            "writing node {} of {} ({}): {total} local ids",
            i + 1,
            nodes.len(),
            c.url()
        ));
        let mut at = 0u64;
        while at < total {
            let end = (at + MAX_BLOCKS_PER_RPC as u64).min(total);
            let writes = (at..end)
                .map(|l| match at_place.get(&(i as u32, l)) {
                    Some(&k) => (l, plan.data[k].clone()),
                    None => {
                        let mut dummy = vec![0u8; bs];
                        rng.fill_bytes(&mut dummy);
                        (l, dummy)
                    }
                })
                .collect();
            let (instance, _) = c.access(&Access { reads: Vec::new(), writes }).await?;
            check_instance(c, instance)?;
            written += end - at;
            at = end;
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::is_balancer_checkpoint;

    #[test]
    fn checkpoints_of_the_previous_format_still_open_without_digests() {
        let key = MasterKey::from_bytes([5; 32]);
        let sealer = StateSealer::new(&key);
        let dir = tempfile::tempdir().unwrap();
        let old = crate::balancer::CheckpointV1 {
            blocks: 10,
            block_size: 64,
            evictions: 2,
            nodes: vec![NodeRecord { id: [1; 16], blocks: 200 }],
            placed: vec![(3, 0, 7)],
            cached: vec![(4, 0, vec![9; 64])],
        };
        state_file::write_checkpoint_as(dir.path(), b"BFLB0001", &old, &sealer).unwrap();
        let buf = std::fs::read(dir.path().join(state_file::CHECKPOINT)).unwrap();
        assert!(is_balancer_checkpoint(&buf));
        let c = decode_checkpoint(&buf, &sealer).unwrap();
        assert_eq!(c.placed, vec![(3, 0, 7, None)]);
        assert_eq!(c.cached, old.cached);
        assert_eq!(c.nodes, old.nodes);
        // And the current format round-trips its digests.
        state_file::write_checkpoint_as(dir.path(), CHECKPOINT_MAGIC, &c, &sealer).unwrap();
        let buf = std::fs::read(dir.path().join(state_file::CHECKPOINT)).unwrap();
        assert!(buf.starts_with(b"BFLB0002"));
        let again = decode_checkpoint(&buf, &sealer).unwrap();
        assert_eq!(again.digest_key, c.digest_key);
        assert_eq!(again.placed, c.placed);
    }
}
