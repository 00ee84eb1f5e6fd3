//! Slurm's topology, from `topology.conf` or the output of `scontrol show topology`, as a [`Fabric`].
//!
//! Both are lines of `Key=Value` words (keys case-insensitive, `#` starts a comment):
//!
//! - **tree plugin**: `SwitchName=s0 Nodes=tux[0-3]` for a leaf switch, `SwitchName=s2
//!   Switches=s[0-1]` for the switch above (`scontrol` adds `Level=`, `LinkSpeed=` and, for upper
//!   switches, every node below them in `Nodes=`). A node's leaf is the lowest switch that lists
//!   it; walking up through `Switches=` gives its spine, and the topmost of three or more
//!   switches names its cluster ([`Placement::from_switch_chain`], as for `SLURM_TOPOLOGY_ADDR`).
//! - **block plugin**: `BlockName=b1 Nodes=node[01-18]` (`scontrol` adds `BlockIndex=`,
//!   `BlockSize=`; `BlockSizes=` lines are ignored). A block is taken as a rack. With a tree as
//!   well, a node gets its rack from its block and the rest from the tree.
//!
//! Host lists use Slurm's syntax (`tux[0-3,12],gpu[01-04]`). Switch cycles, a switch listed twice
//! and a text with no switch or block are errors.

use super::RouteError;
use super::discover::{DEFAULT_CLUSTER, Fabric, Placement, expand_hostlists};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
struct Switch {
    /// Order of appearance, for deterministic choices.
    order: usize,
    children: Vec<String>,
    nodes: Vec<String>,
    level: Option<u32>,
}

/// Parses a `topology.conf` or `scontrol show topology` text (`source` names it in errors and in
/// the fabric) into node placements.
pub fn parse_slurm_topology(text: &str, source: &str) -> Result<Fabric, RouteError> {
    let bad =
        |line: usize, reason: String| RouteError::BadFile { what: "Slurm topology", path: source.into(), reason: format!("line {line}: {reason}") };
    let mut switches: BTreeMap<String, Switch> = BTreeMap::new();
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut fields: HashMap<String, &str> = HashMap::new();
        for word in line.split_whitespace() {
            let (k, v) = word.split_once('=').ok_or_else(|| bad(line_no, format!("{word:?} is not Key=Value")))?;
            fields.insert(k.to_ascii_lowercase(), v);
        }
        let list = |key: &str| -> Result<Vec<String>, RouteError> {
            match fields.get(key) {
                Some(v) if !v.is_empty() && !v.eq_ignore_ascii_case("(null)") => expand_hostlists(v).map_err(|e| bad(line_no, e.to_string())),
                _ => Ok(Vec::new()),
            }
        };
        if let Some(name) = fields.get("switchname") {
            let order = switches.len();
            let sw = Switch {
                order,
                children: list("switches")?,
                nodes: list("nodes")?,
                level: match fields.get("level") {
                    Some(l) => Some(l.parse().map_err(|_| bad(line_no, format!("Level={l} is not a number")))?),
                    None => None,
                },
            };
            if sw.children.is_empty() && sw.nodes.is_empty() {
                return Err(bad(line_no, format!("switch {name} has neither Switches= nor Nodes=")));
            }
            if switches.insert((*name).to_owned(), sw).is_some() {
                return Err(bad(line_no, format!("switch {name} is listed twice")));
            }
        } else if let Some(name) = fields.get("blockname") {
            blocks.push(((*name).to_owned(), list("nodes")?));
        }
        // Other lines (BlockSizes=, headers of newer scontrol output) carry no placement.
    }
    if switches.is_empty() && blocks.is_empty() {
        return Err(RouteError::BadFile { what: "Slurm topology", path: source.into(), reason: "no SwitchName= or BlockName= line".into() });
    }
    let mut placements: BTreeMap<String, Placement> = tree_placements(&switches, source)?;
    for (block, nodes) in blocks {
        for host in nodes {
            let p = placements.entry(host).or_insert_with(Placement::unknown);
            p.rack = Some(block.clone());
        }
    }
    let mut fabric = Fabric::new(source.to_owned());
    for (host, p) in placements {
        fabric.insert(host, p)?;
    }
    Ok(fabric)
}

/// Every node's placement from the switches: leaf = the lowest switch that lists it, then up.
fn tree_placements(switches: &BTreeMap<String, Switch>, source: &str) -> Result<BTreeMap<String, Placement>, RouteError> {
    let err = |reason: String| RouteError::BadFile { what: "Slurm topology", path: source.into(), reason };
    // Each switch's parent: the first (in file order) switch that lists it.
    let mut parent: HashMap<&str, &str> = HashMap::new();
    let mut by_order: Vec<(&String, &Switch)> = switches.iter().collect();
    by_order.sort_by_key(|(_, s)| s.order);
    for (name, sw) in &by_order {
        for c in &sw.children {
            if !switches.contains_key(c) {
                return Err(err(format!("switch {name} lists switch {c}, which is not defined")));
            }
            parent.entry(c.as_str()).or_insert(name.as_str());
        }
    }
    // Levels: given, or 0 for a switch without child switches and one more than its highest child.
    let mut levels: HashMap<&str, u32> = HashMap::new();
    fn level_of<'a>(name: &'a str, switches: &'a BTreeMap<String, Switch>, levels: &mut HashMap<&'a str, u32>, depth: usize) -> Option<u32> {
        if let Some(&l) = levels.get(name) {
            return Some(l);
        }
        if depth > switches.len() {
            return None; // a cycle
        }
        let (key, sw) = switches.get_key_value(name)?;
        let l = match sw.level {
            Some(l) => l,
            None => {
                let mut max = None;
                for c in &sw.children {
                    let cl = level_of(c, switches, levels, depth + 1)?;
                    max = Some(max.map_or(cl, |m: u32| m.max(cl)));
                }
                max.map_or(0, |m| m + 1)
            }
        };
        levels.insert(key.as_str(), l);
        Some(l)
    }
    for name in switches.keys() {
        level_of(name, switches, &mut levels, 0).ok_or_else(|| err(format!("switch {name} is part of a cycle of Switches=")))?;
    }
    // A node's leaf: the switch of lowest level listing it (first in file order on a tie).
    let mut leaf: BTreeMap<&str, (u32, usize, &str)> = BTreeMap::new();
    for (name, sw) in switches {
        let key = (levels[name.as_str()], sw.order, name.as_str());
        for n in &sw.nodes {
            let e = leaf.entry(n.as_str()).or_insert(key);
            if key < *e {
                *e = key;
            }
        }
    }
    let mut out = BTreeMap::new();
    for (node, (_, _, first)) in leaf {
        let mut chain = vec![first.to_owned()];
        let mut at = first;
        while let Some(&p) = parent.get(at) {
            if chain.len() > switches.len() {
                return Err(err(format!("the switches above node {node} form a cycle")));
            }
            chain.push(p.to_owned());
            at = p;
        }
        let mut p = Placement::from_switch_chain(&chain);
        if p.cluster.is_empty() {
            p.cluster = DEFAULT_CLUSTER.into();
        }
        out.insert(node.to_owned(), p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::{DistanceLevel, IntraNodeLink, synthetic_facts, topology_from_facts};

    /// A three-tier fat-tree as `topology.conf` writes it: 4 leaves of 2 nodes, 2 spines, 1 core.
    const TREE_CONF: &str = "\
# fat-tree: leaves s0-s3, spines a0 a1, core c0
SwitchName=s0 Nodes=tux[0-1]
SwitchName=s1 Nodes=tux[2-3]
SwitchName=s2 Nodes=tux[4-5] LinkSpeed=100
SwitchName=s3 Nodes=tux[6-7]
SwitchName=a0 Switches=s[0-1]
SwitchName=a1 Switches=s[2-3]
switchname=c0 switches=a[0-1]   # keys are case-insensitive
";

    /// The same tree as `scontrol show topology` prints it: levels, and upper switches list every
    /// node below them.
    const TREE_SCONTROL: &str = "\
SwitchName=c0 Level=2 LinkSpeed=1 Nodes=tux[0-7] Switches=a[0-1]
SwitchName=a0 Level=1 LinkSpeed=1 Nodes=tux[0-3] Switches=s[0-1]
SwitchName=a1 Level=1 LinkSpeed=1 Nodes=tux[4-7] Switches=s[2-3]
SwitchName=s0 Level=0 LinkSpeed=1 Nodes=tux[0-1]
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=tux[2-3]
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=tux[4-5]
SwitchName=s3 Level=0 LinkSpeed=1 Nodes=tux[6-7]
";

    /// Block plugin: two blocks of two nodes (an NVL-style rack each).
    const BLOCK_CONF: &str = "\
BlockName=b1 Nodes=gpu[01-02]
BlockName=b2 Nodes=gpu[03-04]
BlockSizes=2,4
";

    const BLOCK_SCONTROL: &str = "\
BlockName=b1 BlockIndex=0 Nodes=gpu[01-02] BlockSize=2
BlockName=b2 BlockIndex=1 Nodes=gpu[03-04] BlockSize=2
";

    fn levels(fabric: &Fabric, hosts: &[&str]) -> Vec<DistanceLevel> {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let t = topology_from_facts(&synthetic_facts(&hosts, 1, 1, IntraNodeLink::Nvlink), Some(fabric)).expect("topology");
        (1..hosts.len()).map(|j| t.distance(0, j).expect("in range")).collect()
    }

    #[test]
    fn tree_from_topology_conf_and_from_scontrol_agree() {
        for (text, name) in [(TREE_CONF, "topology.conf"), (TREE_SCONTROL, "scontrol")] {
            let f = parse_slurm_topology(text, name).expect(name);
            assert_eq!(f.hosts().len(), 8, "{name}");
            let p = f.placement("tux5").expect("placed");
            assert_eq!((p.leaf.as_deref(), p.spine.as_deref(), p.cluster.as_str()), (Some("s2"), Some("a1"), "c0"), "{name}");
            // tux0 to: tux1 (same leaf), tux2 (other leaf, same spine), tux4 (other spine, same core).
            assert_eq!(
                levels(&f, &["tux0", "tux1", "tux2", "tux4"]),
                vec![DistanceLevel::Leaf, DistanceLevel::Spine, DistanceLevel::Spine],
                "{name}"
            );
        }
    }

    #[test]
    fn two_level_tree_and_separate_trees() {
        let f = parse_slurm_topology("SwitchName=l0 Nodes=n[1-2]\nSwitchName=l1 Nodes=n3\nSwitchName=top Switches=l[0-1]\n", "t").expect("valid");
        assert_eq!(levels(&f, &["n1", "n2", "n3"]), vec![DistanceLevel::Leaf, DistanceLevel::Spine]);
        // Two roots of three tiers each: different clusters.
        let two = "SwitchName=l0 Nodes=n1\nSwitchName=l1 Nodes=n2\nSwitchName=a0 Switches=l0\nSwitchName=a1 Switches=l1\n\
                   SwitchName=r0 Switches=a0\nSwitchName=r1 Switches=a1\n";
        let f = parse_slurm_topology(two, "t").expect("valid");
        assert_eq!(levels(&f, &["n1", "n2"]), vec![DistanceLevel::CrossCluster]);
    }

    #[test]
    fn blocks_are_racks_and_combine_with_a_tree() {
        for (text, name) in [(BLOCK_CONF, "block conf"), (BLOCK_SCONTROL, "block scontrol")] {
            let f = parse_slurm_topology(text, name).expect(name);
            assert_eq!(f.placement("gpu03").and_then(|p| p.rack.as_deref()), Some("b2"), "{name}");
            assert_eq!(levels(&f, &["gpu01", "gpu02", "gpu03"]), vec![DistanceLevel::Rack, DistanceLevel::Spine], "{name}");
        }
        let both = format!("SwitchName=l0 Nodes=gpu[01-04]\n{BLOCK_CONF}");
        let f = parse_slurm_topology(&both, "both").expect("valid");
        let p = f.placement("gpu04").expect("placed");
        assert_eq!((p.rack.as_deref(), p.leaf.as_deref()), (Some("b2"), Some("l0")));
        assert_eq!(levels(&f, &["gpu01", "gpu02", "gpu03"]), vec![DistanceLevel::Rack, DistanceLevel::Leaf]);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, needle) in [
            ("", "no SwitchName"),
            ("# only a comment\n", "no SwitchName"),
            ("SwitchName=s0\n", "neither Switches= nor Nodes="),
            ("SwitchName=s0 Nodes=a\nSwitchName=s0 Nodes=b\n", "line 2: switch s0 is listed twice"),
            ("SwitchName=s0 Switches=s9\n", "not defined"),
            ("SwitchName=s0 Nodes=n[3-1]\n", "line 1"),
            ("SwitchName=s0 Nodes\n", "not Key=Value"),
            ("SwitchName=s0 Level=x Nodes=a\n", "Level=x"),
            ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", "cycle"),
        ] {
            let e = parse_slurm_topology(text, "topo.conf").expect_err(needle).to_string();
            assert!(e.contains(needle) && e.contains("topo.conf"), "{text:?}: {e}");
        }
    }
}
