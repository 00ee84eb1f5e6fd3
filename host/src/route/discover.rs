//! Building a [`Topology`] from what each PE knows about itself plus where the nodes sit.
//!
//! Inside a node the facts come from the GPUs ([`PeFacts`]: host, GPU UUID, NVLink and P2P
//! peers; probing the GPUs is done elsewhere and gathered across PEs). Beyond the node they come
//! from a [`Fabric`]: a TOML topology file (spines → leaves → racks → nodes), or Slurm's
//! `SLURM_TOPOLOGY_ADDR` / `SLURM_TOPOLOGY_ADDR_PATTERN`, which each PE reads for itself and
//! gathers with its facts. A file wins over Slurm, because it is what the user asked for.
//!
//! Each PE's bitmaps are built from that PE's own facts, so a PE that claims NVLink to a GPU
//! whose PE does not claim it back produces a one-sided bit, which [`Topology::distance`] refuses.

use super::bitmap::{ClaimSet, NO_GROUP, PeCoord};
use super::{RouteError, Topology};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What one PE knows about itself, gathered from every PE before the topology is built.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeFacts {
    /// Host name (PEs with the same host share a node).
    pub host: String,
    /// UUID of the PE's GPU (PEs with the same UUID share a GPU).
    pub gpu_uuid: String,
    /// UUIDs of the GPUs this PE's GPU reaches over NVLink.
    pub nvlink_peers: Vec<String>,
    /// UUIDs of the GPUs this PE's GPU can access peer-to-peer (over NVLink or PCIe).
    pub p2p_peers: Vec<String>,
    /// Where the node sits in the network, when the PE found out itself (Slurm); a [`Fabric`] file overrides it.
    pub placement: Option<Placement>,
    /// The multi-node NVLink domain of the PE's GPU (NVML fabric info), when it has one: GPUs of
    /// one domain are NVLink apart even on different hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<NvlinkDomain>,
}

/// A multi-node NVLink domain as NVML's GPU fabric info names it (GB200 NVL72 and the like): the
/// fabric's cluster UUID and the clique within it. GPUs whose registration with the fabric
/// completed and that report the same pair share NVLink, whatever host they are on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NvlinkDomain {
    /// The fabric cluster UUID, 32 hex digits.
    pub cluster_uuid: String,
    /// The clique within the cluster.
    pub clique_id: u32,
}

/// Where a node sits in the network. Missing parts are unknown; names are scoped by their parents.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// Cluster name: nodes in different clusters are [`super::DistanceLevel::CrossCluster`] apart, nodes of
    /// one cluster at most [`super::DistanceLevel::Spine`] apart (whichever spines they hang under).
    pub cluster: String,
    /// Spine switch, if known. It scopes the leaf names below it; it makes no level of its own,
    /// because nodes under different spines of one cluster still meet at the spine/core tier.
    pub spine: Option<String>,
    /// Leaf switch, if known.
    pub leaf: Option<String>,
    /// Rack, if known.
    pub rack: Option<String>,
}

/// The cluster name used when nothing says otherwise.
pub const DEFAULT_CLUSTER: &str = "default";

impl Placement {
    /// The placement of a node nothing is known about: the job's one cluster.
    pub fn unknown() -> Self {
        Self { cluster: DEFAULT_CLUSTER.into(), ..Self::default() }
    }

    /// Reads a Slurm topology address such as `s0.s3.node17` with pattern `switch.switch.node`
    /// (tree plugin), or `b2.node17` with pattern `block.node` (block plugin).
    ///
    /// Tree: the switch nearest the node is its leaf, the one above is its spine, and the topmost
    /// switch, when there are three or more, names the cluster (switches in between are the
    /// cluster's own core tiers). Block: the block is taken as the node's rack. Returns the host
    /// name and its placement.
    pub fn from_slurm(addr: &str, pattern: &str) -> Result<(String, Placement), RouteError> {
        let parts: Vec<&str> = addr.split('.').collect();
        let kinds: Vec<&str> = pattern.split('.').collect();
        if parts.len() != kinds.len() || parts.iter().any(|p| p.is_empty()) {
            return Err(RouteError::Slurm(format!("SLURM_TOPOLOGY_ADDR={addr:?} does not match SLURM_TOPOLOGY_ADDR_PATTERN={pattern:?}")));
        }
        let host = parts[parts.len() - 1].to_owned();
        if kinds == ["block", "node"] {
            return Ok((host, Placement { rack: Some(parts[0].to_owned()), ..Placement::unknown() }));
        }
        if kinds.last() != Some(&"node") || kinds[..kinds.len() - 1].iter().any(|k| *k != "switch") {
            return Err(RouteError::Slurm(format!("SLURM_TOPOLOGY_ADDR_PATTERN={pattern:?}: expected switch.….node (tree) or block.node (block)")));
        }
        let switches: Vec<String> = parts[..parts.len() - 1].iter().rev().map(|s| (*s).to_owned()).collect();
        Ok((host, Placement::from_switch_chain(&switches)))
    }

    /// The placement of a node whose switches, nearest first, are `chain`: leaf, spine, and the
    /// topmost of three or more as the cluster.
    pub fn from_switch_chain(chain: &[String]) -> Placement {
        Placement {
            cluster: match chain {
                [_, _, .., top] => top.clone(),
                _ => DEFAULT_CLUSTER.into(),
            },
            spine: chain.get(1).cloned(),
            leaf: chain.first().cloned(),
            rack: None,
        }
    }

    /// This process's placement from Slurm's environment, or `None` when Slurm sets none.
    ///
    /// `env` is a lookup so that tests need not touch the process environment.
    pub fn from_slurm_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<(String, Placement)>, RouteError> {
        match (env("SLURM_TOPOLOGY_ADDR"), env("SLURM_TOPOLOGY_ADDR_PATTERN")) {
            (Some(addr), Some(pattern)) => Self::from_slurm(&addr, &pattern).map(Some),
            (Some(_), None) => Err(RouteError::Slurm("SLURM_TOPOLOGY_ADDR is set without SLURM_TOPOLOGY_ADDR_PATTERN".into())),
            _ => Ok(None),
        }
    }

    // Keys scoped by their parents so that two racks called "r0" under different leaves differ.
    fn spine_key(&self) -> String {
        format!("{}/{}", self.cluster, self.spine.as_deref().unwrap_or("*"))
    }
    fn leaf_key(&self) -> Option<String> {
        self.leaf.as_ref().map(|l| format!("{}/{l}", self.spine_key()))
    }
    fn rack_key(&self) -> Option<String> {
        self.rack.as_ref().map(|r| format!("{}/{r}", self.leaf_key().unwrap_or_else(|| self.spine_key())))
    }
}

/// Node placements by host name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fabric {
    placements: HashMap<String, Placement>,
    order: Vec<String>,
    /// Where it came from, for logs.
    pub source: String,
}

impl Fabric {
    /// An empty fabric (every node in one unnamed cluster).
    pub fn new(source: impl Into<String>) -> Self {
        Self { source: source.into(), ..Self::default() }
    }

    /// Places a host; a host placed twice is an error.
    pub fn insert(&mut self, host: String, placement: Placement) -> Result<(), RouteError> {
        if self.placements.contains_key(&host) {
            return Err(RouteError::InvalidTopology(format!("node {host} is listed twice in {}", self.source)));
        }
        self.order.push(host.clone());
        self.placements.insert(host, placement);
        Ok(())
    }

    /// The placement of a host, if listed.
    pub fn placement(&self, host: &str) -> Option<&Placement> {
        self.placements.get(host)
    }

    /// The hosts, in the order they were listed.
    pub fn hosts(&self) -> &[String] {
        &self.order
    }
}

/// How the GPUs inside one node are connected (for synthetic facts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntraNodeLink {
    /// Every GPU has NVLink to every other (NVSwitch systems such as HGX H200).
    #[default]
    Nvlink,
    /// Peer access over PCIe, no NVLink.
    PcieP2p,
    /// No peer access at all.
    NoP2p,
}

/// A topology file: what each node looks like, and where the nodes sit.
///
/// ```toml
/// [node]                 # optional; used to synthesise PEs for `halo route`
/// gpus = 8
/// pes_per_gpu = 1
/// link = "nvlink"        # nvlink | pcie-p2p | no-p2p
///
/// [[spine]]
/// name = "s0"
/// cluster = "west"       # optional
/// [[spine.leaf]]
/// name = "l0"
/// [[spine.leaf.rack]]
/// name = "r0"
/// nodes = ["gpu[001-004]", "gpu010"]
/// ```
///
/// A leaf may also list `nodes` directly (rack unknown). Host lists accept bracket range groups
/// with comma-separated numbers or ranges, as Slurm writes them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    /// Inside one node.
    #[serde(default)]
    pub node: NodeShape,
    /// The spines.
    #[serde(default)]
    pub spine: Vec<SpineSpec>,
}

/// What one node looks like.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeShape {
    /// GPUs per node.
    #[serde(default = "default_gpus")]
    pub gpus: usize,
    /// PEs per GPU.
    #[serde(default = "default_one")]
    pub pes_per_gpu: usize,
    /// How the GPUs are connected.
    #[serde(default)]
    pub link: IntraNodeLink,
}

fn default_gpus() -> usize {
    8
}
fn default_one() -> usize {
    1
}

impl Default for NodeShape {
    fn default() -> Self {
        Self { gpus: default_gpus(), pes_per_gpu: 1, link: IntraNodeLink::Nvlink }
    }
}

/// One spine switch and the leaves below it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpineSpec {
    /// Its name.
    pub name: String,
    /// Cluster it belongs to (default: [`DEFAULT_CLUSTER`]).
    pub cluster: Option<String>,
    /// Leaves below it.
    #[serde(default)]
    pub leaf: Vec<LeafSpec>,
}

/// One leaf switch, its racks, and nodes whose rack is unknown.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeafSpec {
    /// Its name.
    pub name: String,
    /// Racks below it.
    #[serde(default)]
    pub rack: Vec<RackSpec>,
    /// Nodes attached directly (rack unknown).
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// One rack of nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackSpec {
    /// Its name.
    pub name: String,
    /// Host names or host lists (`gpu[001-008]`).
    pub nodes: Vec<String>,
}

impl TopologyFile {
    /// Reads and parses a topology file.
    pub fn load(path: &Path) -> Result<Self, RouteError> {
        let text = std::fs::read_to_string(path).map_err(|source| RouteError::Io { what: "topology file", path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Parses a topology file's text (`path` only names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, RouteError> {
        let f: TopologyFile =
            toml::from_str(text).map_err(|e| RouteError::BadFile { what: "topology file", path: path.to_owned(), reason: e.to_string() })?;
        if f.node.gpus == 0 || f.node.pes_per_gpu == 0 {
            return Err(RouteError::BadFile {
                what: "topology file",
                path: path.to_owned(),
                reason: "[node] gpus and pes_per_gpu must be at least 1".into(),
            });
        }
        Ok(f)
    }

    /// The node placements the file describes.
    pub fn fabric(&self, source: &Path) -> Result<Fabric, RouteError> {
        let mut fabric = Fabric::new(source.display().to_string());
        for s in &self.spine {
            let cluster = s.cluster.clone().unwrap_or_else(|| DEFAULT_CLUSTER.into());
            for l in &s.leaf {
                let base = Placement { cluster: cluster.clone(), spine: Some(s.name.clone()), leaf: Some(l.name.clone()), rack: None };
                for host in expand_all(&l.nodes)? {
                    fabric.insert(host, base.clone())?;
                }
                for r in &l.rack {
                    for host in expand_all(&r.nodes)? {
                        fabric.insert(host, Placement { rack: Some(r.name.clone()), ..base.clone() })?;
                    }
                }
            }
        }
        Ok(fabric)
    }

    /// Facts for every PE of every node in the file, in file order, as [`synthetic_facts`] makes them.
    pub fn synthetic_facts(&self, fabric: &Fabric) -> Vec<PeFacts> {
        synthetic_facts(fabric.hosts(), self.node.gpus, self.node.pes_per_gpu, self.node.link)
    }
}

fn expand_all(lists: &[String]) -> Result<Vec<String>, RouteError> {
    let mut out = Vec::new();
    for l in lists {
        out.extend(expand_hostlist(l)?);
    }
    Ok(out)
}

/// Expands one Slurm-style host name pattern: `gpu[001-003,7]` → gpu001, gpu002, gpu003, gpu7;
/// several bracket groups multiply (`r[1-2]n[1-2]` → r1n1, r1n2, r2n1, r2n2). Zero padding
/// follows the width of each range's first number. At most a million names.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, RouteError> {
    let bad = |reason: &str| RouteError::Parse { what: "host list", value: list.to_owned(), reason: reason.to_owned() };
    if list.trim().is_empty() {
        return Err(bad("empty"));
    }
    let out = expand_groups(list.trim(), &bad)?;
    if out.len() > MAX_HOSTS {
        return Err(bad("expands to more than a million names"));
    }
    Ok(out)
}

/// Expands a comma-separated list of host name patterns, splitting only at commas outside
/// brackets, as Slurm writes `Nodes=tux[0-3,12],gpu[01-04]`.
pub fn expand_hostlists(lists: &str) -> Result<Vec<String>, RouteError> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in lists.char_indices().chain([(lists.len(), ',')]) {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                let item = &lists[start..i];
                if !item.trim().is_empty() {
                    out.extend(expand_hostlist(item)?);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if out.len() > MAX_HOSTS {
        return Err(RouteError::Parse { what: "host list", value: lists.to_owned(), reason: "expands to more than a million names".into() });
    }
    Ok(out)
}

const MAX_HOSTS: usize = 1_000_000;

fn expand_groups(s: &str, bad: &dyn Fn(&str) -> RouteError) -> Result<Vec<String>, RouteError> {
    let Some(open) = s.find('[') else {
        return if s.contains(']') { Err(bad("']' without '['")) } else { Ok(vec![s.to_owned()]) };
    };
    let close = s[open..].find(']').map(|c| open + c).ok_or_else(|| bad("'[' without ']'"))?;
    let (prefix, inner, rest) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    if prefix.contains(']') || inner.contains('[') {
        return Err(bad("brackets do not nest"));
    }
    let tails = expand_groups(rest, bad)?;
    let mut out = Vec::new();
    for item in inner.split(',') {
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let width = lo.trim().len();
        let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad("ranges need numbers, like [01-16]"));
        let (a, b) = (num(lo)?, num(hi)?);
        if a > b || (b - a) as usize >= MAX_HOSTS || out.len() + (b - a + 1) as usize * tails.len() > MAX_HOSTS {
            return Err(bad("range is reversed or expands to more than a million names"));
        }
        for n in a..=b {
            out.extend(tails.iter().map(|t| format!("{prefix}{n:0width$}{t}")));
        }
    }
    Ok(out)
}

/// Facts for `gpus` GPUs × `pes_per_gpu` PEs on each host, all connected by `link` inside a node
/// (UUIDs `GPU-<host>-<index>`). The stand-in until real GPU discovery feeds [`topology_from_facts`].
pub fn synthetic_facts(hosts: &[String], gpus: usize, pes_per_gpu: usize, link: IntraNodeLink) -> Vec<PeFacts> {
    let mut out = Vec::with_capacity(hosts.len() * gpus * pes_per_gpu);
    for host in hosts {
        let uuids: Vec<String> = (0..gpus).map(|g| format!("GPU-{host}-{g}")).collect();
        for (g, uuid) in uuids.iter().enumerate() {
            let others: Vec<String> = uuids.iter().enumerate().filter(|(o, _)| *o != g).map(|(_, u)| u.clone()).collect();
            let (nvlink_peers, p2p_peers) = match link {
                IntraNodeLink::Nvlink => (others.clone(), others),
                IntraNodeLink::PcieP2p => (Vec::new(), others),
                IntraNodeLink::NoP2p => (Vec::new(), Vec::new()),
            };
            for _ in 0..pes_per_gpu {
                out.push(PeFacts {
                    host: host.clone(),
                    gpu_uuid: uuid.clone(),
                    nvlink_peers: nvlink_peers.clone(),
                    p2p_peers: p2p_peers.clone(),
                    placement: None,
                    nvlink_domain: None,
                });
            }
        }
    }
    out
}

/// Builds the topology from every PE's facts (`facts[i]` is PE `i`) and, if given, a fabric.
///
/// PE `i`'s view, level by level: same GPU = PEs with `i`'s GPU UUID; NVLink = plus PEs on GPUs in
/// `i`'s `nvlink_peers` and PEs in `i`'s NVLink domain; PCIe = plus those in `i`'s `p2p_peers`;
/// same node = PEs with `i`'s host; rack / leaf / spine = PEs whose hosts share `i`'s rack / leaf /
/// cluster (placement from the fabric, else from the facts, else unknown: one cluster for the
/// whole job); cross-cluster = all. Names are interned into the small ids of a [`PeCoord`], so
/// the result takes memory linear in the PEs (see [`Topology`]).
pub fn topology_from_facts(facts: &[PeFacts], fabric: Option<&Fabric>) -> Result<Topology, RouteError> {
    if facts.is_empty() {
        return Err(RouteError::InvalidTopology("no PE facts".into()));
    }
    // GPU ids first, so that a claim can name the GPU of a later PE.
    let mut gpus = Interner::default();
    for (pe, f) in facts.iter().enumerate() {
        if f.gpu_uuid.is_empty() || f.host.is_empty() {
            return Err(RouteError::InvalidTopology(format!("PE {pe} reported no host or no GPU UUID")));
        }
        gpus.id(&f.gpu_uuid);
    }
    let (mut hosts, mut racks, mut leaves, mut clusters, mut domains) = <(Interner, Interner, Interner, Interner, Interner)>::default();
    let mut claim_ids: HashMap<ClaimSet, u32> = HashMap::new();
    let mut claims = Vec::new();
    let mut coords = Vec::with_capacity(facts.len());
    let unknown = Placement::unknown();
    let mut unplaced = 0usize;
    for f in facts {
        let gpu = gpus.id(&f.gpu_uuid);
        // Claims of unknown GPUs are dropped (no PE runs there); a PE's own GPU is added, so that
        // the PEs of a fully connected node share one claim set.
        let known = |list: &[String]| -> Vec<u32> { list.iter().filter_map(|u| gpus.get(u)).chain([gpu]).collect() };
        let set = ClaimSet { nvlink: known(&f.nvlink_peers), p2p: known(&f.p2p_peers) }.normalised();
        let next = claims.len() as u32;
        let claim = *claim_ids.entry(set).or_insert_with_key(|k| {
            claims.push(k.clone());
            next
        });
        let p = fabric.and_then(|fb| fb.placement(&f.host)).or(f.placement.as_ref());
        if p.is_none() && fabric.is_some() {
            unplaced += 1;
        }
        let p = p.unwrap_or(&unknown);
        coords.push(PeCoord {
            gpu,
            claims: claim,
            nvlink_domain: f.nvlink_domain.as_ref().map_or(NO_GROUP, |d| domains.id(&format!("{}/{}", d.cluster_uuid, d.clique_id))),
            host: hosts.id(&f.host),
            rack: p.rack_key().map_or(NO_GROUP, |k| racks.id(&k)),
            leaf: p.leaf_key().map_or(NO_GROUP, |k| leaves.id(&k)),
            // The spine level is the cluster: nodes under different spines of one cluster meet at
            // the spine (or core) tier, not over a wide-area link.
            cluster: clusters.id(&p.cluster),
        });
    }
    if unplaced > 0 {
        tracing::warn!(
            "route: {unplaced} PEs run on hosts missing from {}; they are placed in one unknown spine",
            fabric.map_or("", |f| f.source.as_str())
        );
    }
    Topology::from_parts(coords, claims)
}

/// Names to small ids, in order of first appearance (so the same facts give the same ids).
#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
}

impl Interner {
    fn id(&mut self, name: &str) -> u32 {
        let next = self.ids.len() as u32;
        match self.ids.get(name) {
            Some(&id) => id,
            None => {
                self.ids.insert(name.to_owned(), next);
                next
            }
        }
    }

    fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }
}

/// A topology read from a file: the facts it synthesises and the fabric it places them in.
pub fn topology_from_file(path: &Path) -> Result<(Topology, TopologyFile, Fabric), RouteError> {
    let file = TopologyFile::load(path)?;
    let fabric = file.fabric(path)?;
    if fabric.hosts().is_empty() {
        return Err(RouteError::BadFile { what: "topology file", path: PathBuf::from(path), reason: "lists no nodes".into() });
    }
    let facts = file.synthetic_facts(&fabric);
    let topo = topology_from_facts(&facts, Some(&fabric))?;
    Ok((topo, file, fabric))
}

/// Node placements from a file: a halo topology file (TOML, see [`TopologyFile`]) or Slurm's
/// topology (`topology.conf` or saved `scontrol show topology` output, see
/// [`super::slurm::parse_slurm_topology`]), told apart by content: a `SwitchName=` or
/// `BlockName=` line means Slurm.
pub fn load_fabric(path: &Path) -> Result<Fabric, RouteError> {
    let text = std::fs::read_to_string(path).map_err(|source| RouteError::Io { what: "topology file", path: path.to_owned(), source })?;
    let slurm = text.lines().map(|l| l.trim_start().to_ascii_lowercase()).any(|l| l.starts_with("switchname=") || l.starts_with("blockname="));
    if slurm {
        return super::slurm::parse_slurm_topology(&text, &path.display().to_string());
    }
    TopologyFile::parse(&text, path)?.fabric(path)
}

/// One node of `pes` PEs, one per GPU, all NVLink-connected: the model `halo route` uses without a file.
pub fn single_node(pes: usize) -> Result<Topology, RouteError> {
    topology_from_facts(&synthetic_facts(&["localhost".to_owned()], pes, 1, IntraNodeLink::Nvlink), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::DistanceLevel;

    #[test]
    fn hostlists() {
        assert_eq!(expand_hostlist("gpu[001-003,7]").ok(), Some(vec!["gpu001".into(), "gpu002".into(), "gpu003".into(), "gpu7".into()]));
        assert_eq!(expand_hostlist("login").ok(), Some(vec!["login".into()]));
        assert!(expand_hostlist("gpu[3-1]").is_err());
        assert!(expand_hostlist("gpu[1-2").is_err());
        assert!(expand_hostlist("gpu1-2]").is_err());
        assert!(expand_hostlist("a[[1]]").is_err());
        assert!(expand_hostlist("n[0-99999999]").is_err(), "too many");
        assert_eq!(expand_hostlist("r[1-2]n[08-09]").ok(), Some(vec!["r1n08".into(), "r1n09".into(), "r2n08".into(), "r2n09".into()]));
        assert_eq!(
            expand_hostlists("tux[0-1,12],login, gpu[01-02]").ok(),
            Some(vec!["tux0".into(), "tux1".into(), "tux12".into(), "login".into(), "gpu01".into(), "gpu02".into()])
        );
    }

    #[test]
    fn slurm_addresses() {
        let (host, p) = Placement::from_slurm("top.s1.l3.node7", "switch.switch.switch.node").expect("valid");
        assert_eq!(host, "node7");
        assert_eq!((p.cluster.as_str(), p.spine.as_deref(), p.leaf.as_deref()), ("top", Some("s1"), Some("l3")));
        let (_, p) = Placement::from_slurm("l3.n1", "switch.node").expect("valid");
        assert_eq!((p.spine, p.leaf.as_deref()), (None, Some("l3")));
        // Four tiers: the root names the cluster, the tier under it is the cluster's core.
        let (_, p) = Placement::from_slurm("root.core1.s1.l3.n1", "switch.switch.switch.switch.node").expect("valid");
        assert_eq!((p.cluster.as_str(), p.spine.as_deref(), p.leaf.as_deref()), ("root", Some("s1"), Some("l3")));
        let (h, p) = Placement::from_slurm("b7.n1", "block.node").expect("valid");
        assert_eq!((h.as_str(), p.rack.as_deref(), p.cluster.as_str()), ("n1", Some("b7"), DEFAULT_CLUSTER));
        assert!(Placement::from_slurm("b7.n1", "block.switch").is_err());
        assert!(Placement::from_slurm("a.b", "switch.switch.node").is_err());
        let env = |k: &str| match k {
            "SLURM_TOPOLOGY_ADDR" => Some("s0.l0.n9".to_owned()),
            "SLURM_TOPOLOGY_ADDR_PATTERN" => Some("switch.switch.node".to_owned()),
            _ => None,
        };
        assert_eq!(Placement::from_slurm_env(&env).ok().flatten().map(|(h, _)| h), Some("n9".into()));
        assert!(matches!(Placement::from_slurm_env(&|_| None), Ok(None)));
    }

    #[test]
    fn single_node_is_all_nvlink() {
        let t = single_node(4).expect("valid");
        assert_eq!(t.distance(0, 3).ok(), Some(DistanceLevel::NvLink));
        assert_eq!(t.distance(2, 2).ok(), Some(DistanceLevel::SameGpu));
    }

    #[test]
    fn slurm_placements_in_facts() {
        let mut facts = synthetic_facts(&["a".into(), "b".into(), "c".into()], 1, 1, IntraNodeLink::Nvlink);
        for (f, leaf) in facts.iter_mut().zip(["l0", "l0", "l1"]) {
            f.placement = Some(Placement { cluster: "x".into(), spine: Some("s".into()), leaf: Some(leaf.into()), rack: None });
        }
        let t = topology_from_facts(&facts, None).expect("valid");
        assert_eq!(t.distance(0, 1).ok(), Some(DistanceLevel::Leaf));
        assert_eq!(t.distance(0, 2).ok(), Some(DistanceLevel::Spine));
    }
}
