//! The Resource Information Base (RIB) of an IPC process, and its RIB daemon.
//!
//! The RIB holds the state of the IPCP's layer management as a tree of
//! objects named by paths in IRATI's style: `/difm/enr`,
//! `/difm/enr/neighs/pn=alpha.net`, `/ra/qoscubes/id=2`, `/fa/flows/key=1-7`.
//! Every object has a class (`Neighbor`, `QoSCube`, ...), its full name, an
//! instance number (unique in this RIB, assigned on creation, never reused),
//! a value ([`ObjValue`]) and the [`OwnerId`] of the component responsible
//! for it. The root `/` always exists (class [`ROOT_CLASS`], instance 0) and
//! cannot be created, written or deleted.
//!
//! Parents: [`Rib::create`] requires the parent object to exist and names it
//! in the error if it does not, so a typo in a component's path is caught
//! rather than silently growing a branch. [`Rib::create_with_parents`] is the
//! explicit alternative: missing ancestors are created as plain objects of
//! class [`CONTAINER_CLASS`] with no value, owned by the same owner.
//!
//! Names are checked ([`validate_name`]): absolute, no empty segment (no `//`
//! and no trailing `/`), only printable characters, at most
//! [`Config::max_name_len`] bytes and [`Config::max_depth`] levels. The RIB
//! holds at most [`Config::max_objects`] objects besides the root.
//!
//! [`RibDaemon`] (in [`daemon`]) dispatches the CDAP requests of peers to the
//! component owning the object, answers reads from the tree where the owner
//! allows it, and splits large read answers into `F_RD_INCOMPLETE` parts.
//! [`Rib::snapshot`] gives plain rows for `rinactl rib`.

use rina_wire::cdap::prost::Message;
use rina_wire::cdap::{ObjVal, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use thiserror::Error;

pub mod daemon;

pub use daemon::{
    reassemble_read, DaemonConfig, DaemonCounters, DaemonError, ReadObject, ReadPolicy, Reply,
    RibDaemon, RibEvent, SessionId, Subscription,
};

/// Name of the root object.
pub const ROOT: &str = "/";

/// Class of the root object.
pub const ROOT_CLASS: &str = "RIB";

/// Class of the ancestors [`Rib::create_with_parents`] creates.
pub const CONTAINER_CLASS: &str = "container";

/// Depth that reads the whole subtree ([`Rib::read`], [`Rib::snapshot`]).
pub const ALL_LEVELS: usize = usize::MAX;

/// Longest value summary in a [`RibEntry`], in characters (before the
/// "… (N bytes)" tail).
pub const SUMMARY_LEN: usize = 64;

/// Characters of a string value shown by [`ObjValue::summary`]: a line of
/// state (an enrollment's step and last error, a flow's EFCP and DTCP
/// counters) stays whole.
pub const STR_SUMMARY_LEN: usize = 1024;

/// Names the component responsible for an object or a subtree: the
/// enrollment task, the flow allocator, ... A short static name, shown by
/// `rinactl rib`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId(pub &'static str);

impl OwnerId {
    /// The RIB daemon itself (owns the root and answers reads).
    pub const RIB_DAEMON: OwnerId = OwnerId("rib-daemon");
    /// The enrollment task (`/difm/enr`, `/difm/ops`).
    pub const ENROLLMENT: OwnerId = OwnerId("enrollment");
    /// The namespace manager (`/difm/nsm`, `/difm/nam`).
    pub const NAMESPACE_MANAGER: OwnerId = OwnerId("namespace-manager");
    /// The flow allocator (`/fa`).
    pub const FLOW_ALLOCATOR: OwnerId = OwnerId("flow-allocator");
    /// The resource allocator (`/ra`; in the normal IPCP also the
    /// neighbours' hellos, `/difm/enr/hello`).
    pub const RESOURCE_ALLOCATOR: OwnerId = OwnerId("resource-allocator");
    /// The security manager: authentication of N-1 ports (`/difm/auth`).
    pub const SECURITY_MANAGER: OwnerId = OwnerId("security-manager");
    /// Routing (`/ra/fsos`).
    pub const ROUTING: OwnerId = OwnerId("routing");

    /// The name.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Limits of one RIB.
#[derive(Debug, Clone)]
pub struct Config {
    /// Most objects besides the root.
    pub max_objects: usize,
    /// Longest object name, in bytes.
    pub max_name_len: usize,
    /// Most segments in a name (`/a/b` has 2).
    pub max_depth: usize,
    /// Longest class name, in bytes.
    pub max_class_len: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_objects: 65_536,
            max_name_len: 512,
            max_depth: 16,
            max_class_len: 128,
        }
    }
}

/// The value of an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum ObjValue {
    /// No value (containers, objects that are only a name).
    #[default]
    None,
    /// Opaque bytes.
    Bytes(Vec<u8>),
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A prost-encoded payload message of protobuf class `class`
    /// (e.g. `neighbor_t`); sent as `byteval` over CDAP.
    Encoded {
        /// Name of the payload's message type.
        class: String,
        /// The encoded message.
        bytes: Vec<u8>,
    },
}

impl ObjValue {
    /// `m` encoded, tagged with its message type name `class`.
    pub fn encoded<M: Message>(class: &str, m: &M) -> Self {
        ObjValue::Encoded {
            class: class.to_string(),
            bytes: m.encode_to_vec(),
        }
    }

    /// The CDAP object value: `None` for [`ObjValue::None`], `int64val` for
    /// integers, `byteval` for bytes and encoded payloads.
    pub fn to_cdap(&self) -> Option<ObjVal> {
        Some(match self {
            ObjValue::None => return None,
            ObjValue::Bytes(b) => ObjVal::from(b.clone()),
            ObjValue::Str(s) => ObjVal::from(s.clone()),
            ObjValue::Int(i) => ObjVal::from(*i),
            ObjValue::Bool(b) => ObjVal::from(*b),
            ObjValue::Encoded { bytes, .. } => ObjVal::from(bytes.clone()),
        })
    }

    /// The value carried by a CDAP message. All integer fields become
    /// [`ObjValue::Int`]; `byteval` becomes [`ObjValue::Bytes`] (the wire
    /// does not say which payload it is); floating-point values become their
    /// decimal [`ObjValue::Str`].
    pub fn from_cdap(v: Option<&ObjVal>) -> Self {
        match v.and_then(ObjVal::value) {
            None => ObjValue::None,
            Some(Value::Int(i) | Value::SInt(i)) => ObjValue::Int(i.into()),
            Some(Value::Int64(i) | Value::SInt64(i)) => ObjValue::Int(i),
            Some(Value::Str(s)) => ObjValue::Str(s),
            Some(Value::Bytes(b)) => ObjValue::Bytes(b),
            Some(Value::Float(f)) => ObjValue::Str(f.to_string()),
            Some(Value::Double(f)) => ObjValue::Str(f.to_string()),
            Some(Value::Bool(b)) => ObjValue::Bool(b),
        }
    }

    /// One line for humans: bytes as hex (the first [`SUMMARY_LEN`] / 2
    /// bytes, then "… (N bytes)"), strings as they are (cut after
    /// [`STR_SUMMARY_LEN`] characters), encoded payloads as `<class, N bytes>`,
    /// no value as the empty string.
    pub fn summary(&self) -> String {
        match self {
            ObjValue::None => String::new(),
            ObjValue::Bytes(b) => {
                let shown = SUMMARY_LEN / 2;
                let mut s: String = b.iter().take(shown).map(|x| format!("{x:02x}")).collect();
                if b.len() > shown {
                    s.push_str(&format!("… ({} bytes)", b.len()));
                }
                s
            }
            ObjValue::Str(s) => {
                let mut out: String = s.chars().take(STR_SUMMARY_LEN).collect();
                if out.len() < s.len() {
                    out.push_str(&format!("… ({} bytes)", s.len()));
                }
                out
            }
            ObjValue::Int(i) => i.to_string(),
            ObjValue::Bool(b) => b.to_string(),
            ObjValue::Encoded { class, bytes } => format!("<{class}, {} bytes>", bytes.len()),
        }
    }
}

/// One object of the RIB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RibObject {
    /// Its class.
    pub class: String,
    /// Its full name (path).
    pub name: String,
    /// Its instance number, unique in the RIB.
    pub instance: u64,
    /// Its value.
    pub value: ObjValue,
    /// The component responsible for it.
    pub owner: OwnerId,
}

/// One row of [`Rib::snapshot`]: plain data for `rinactl rib`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RibEntry {
    /// Class of the object.
    pub class: String,
    /// Full name of the object.
    pub name: String,
    /// Instance number.
    pub instance: u64,
    /// The value in one line ([`ObjValue::summary`]).
    pub value_summary: String,
    /// Name of the owning component.
    pub owner: String,
}

/// What is wrong with an object name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameProblem {
    /// The name is the empty string.
    #[error("the name is empty")]
    Empty,
    /// The name does not start with `/`.
    #[error("it does not start with '/'")]
    NotAbsolute,
    /// Two `/` in a row, or a `/` at the end.
    #[error("empty segment at byte {0} (\"//\" or a trailing '/')")]
    EmptySegment(usize),
    /// A control or non-space whitespace character.
    #[error("non-printable character {ch:?} at byte {at}")]
    NonPrintable {
        /// Byte offset of the character.
        at: usize,
        /// The character.
        ch: char,
    },
    /// Longer than [`Config::max_name_len`].
    #[error("{len} bytes long, more than the limit of {max}")]
    TooLong {
        /// Length of the name in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More segments than [`Config::max_depth`].
    #[error("{depth} levels deep, more than the limit of {max}")]
    TooDeep {
        /// Number of segments.
        depth: usize,
        /// The limit.
        max: usize,
    },
}

/// Why an operation on the RIB failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RibError {
    /// The object name is not valid.
    #[error("invalid object name {name:?}: {problem}")]
    InvalidName {
        /// The name (cut to 80 characters).
        name: String,
        /// What is wrong with it.
        problem: NameProblem,
    },
    /// The class name is empty, too long or has non-printable characters.
    #[error("invalid class {class:?} for {name}: empty, longer than {max} bytes or not printable")]
    InvalidClass {
        /// The class (cut to 80 characters).
        class: String,
        /// The object it was given for.
        name: String,
        /// The length limit.
        max: usize,
    },
    /// No object has this name.
    #[error("no object {0}")]
    NotFound(String),
    /// An object with this name exists already.
    #[error("object {name} exists already (class {class})")]
    AlreadyExists {
        /// Its name.
        name: String,
        /// The class of the existing object.
        class: String,
    },
    /// The parent of the object to create does not exist.
    #[error("cannot create {name}: its parent {parent} does not exist")]
    ParentMissing {
        /// The object to create.
        name: String,
        /// Its missing parent.
        parent: String,
    },
    /// The RIB holds [`Config::max_objects`] objects already.
    #[error("cannot create {name}: the RIB is full ({max} objects)")]
    Full {
        /// The object that did not fit.
        name: String,
        /// The limit.
        max: usize,
    },
    /// The root `/` cannot be created, written or deleted.
    #[error("the root object / cannot be {0}")]
    Root(&'static str),
}

fn clip(s: &str) -> String {
    if s.chars().count() <= 80 {
        s.to_string()
    } else {
        let mut c: String = s.chars().take(80).collect();
        c.push('…');
        c
    }
}

fn printable(c: char) -> bool {
    !c.is_control() && (c == ' ' || !c.is_whitespace())
}

/// Checks an object name against the rules of the module documentation.
pub fn validate_name(name: &str, cfg: &Config) -> Result<(), RibError> {
    let bad = |problem| RibError::InvalidName {
        name: clip(name),
        problem,
    };
    if name.is_empty() {
        return Err(bad(NameProblem::Empty));
    }
    if name.len() > cfg.max_name_len {
        return Err(bad(NameProblem::TooLong {
            len: name.len(),
            max: cfg.max_name_len,
        }));
    }
    if !name.starts_with('/') {
        return Err(bad(NameProblem::NotAbsolute));
    }
    if let Some((at, ch)) = name.char_indices().find(|&(_, c)| !printable(c)) {
        return Err(bad(NameProblem::NonPrintable { at, ch }));
    }
    if name == ROOT {
        return Ok(());
    }
    let b = name.as_bytes();
    if let Some(at) = (1..b.len()).find(|&i| b[i] == b'/' && b[i - 1] == b'/') {
        return Err(bad(NameProblem::EmptySegment(at)));
    }
    if name.ends_with('/') {
        return Err(bad(NameProblem::EmptySegment(name.len() - 1)));
    }
    let depth = depth_of(name);
    if depth > cfg.max_depth {
        return Err(bad(NameProblem::TooDeep {
            depth,
            max: cfg.max_depth,
        }));
    }
    Ok(())
}

/// Number of segments of a valid name (`/` has 0, `/a/b` has 2).
pub fn depth_of(name: &str) -> usize {
    if name == ROOT {
        0
    } else {
        name.matches('/').count()
    }
}

/// The parent of a valid name: `/a/b` → `/a`, `/a` → `/`, `/` → `None`.
pub fn parent_of(name: &str) -> Option<&str> {
    if name == ROOT {
        return None;
    }
    match name.rfind('/') {
        Some(0) => Some(ROOT),
        Some(i) => Some(&name[..i]),
        None => None,
    }
}

/// The name itself, then each ancestor up to the root.
pub fn ancestors(name: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(name), |n| parent_of(n))
}

#[derive(Debug, Clone)]
struct Node {
    obj: RibObject,
    /// Full names of the children.
    children: BTreeSet<String>,
}

/// The RIB: a tree of objects. See the module documentation.
#[derive(Debug, Clone)]
pub struct Rib {
    cfg: Config,
    nodes: BTreeMap<String, Node>,
    next_instance: u64,
}

impl Default for Rib {
    fn default() -> Self {
        Rib::new(Config::default())
    }
}

impl Rib {
    /// A RIB holding only the root.
    pub fn new(cfg: Config) -> Self {
        let mut nodes = BTreeMap::new();
        nodes.insert(
            ROOT.to_string(),
            Node {
                obj: RibObject {
                    class: ROOT_CLASS.to_string(),
                    name: ROOT.to_string(),
                    instance: 0,
                    value: ObjValue::None,
                    owner: OwnerId::RIB_DAEMON,
                },
                children: BTreeSet::new(),
            },
        );
        Rib {
            cfg,
            nodes,
            next_instance: 1,
        }
    }

    /// The limits.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Number of objects besides the root.
    pub fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    /// True if the RIB holds only the root.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True if an object has this name.
    pub fn contains(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// The object named `name`.
    pub fn get(&self, name: &str) -> Option<&RibObject> {
        self.nodes.get(name).map(|n| &n.obj)
    }

    fn check_class(&self, name: &str, class: &str) -> Result<(), RibError> {
        if class.is_empty() || class.len() > self.cfg.max_class_len || !class.chars().all(printable)
        {
            return Err(RibError::InvalidClass {
                class: clip(class),
                name: clip(name),
                max: self.cfg.max_class_len,
            });
        }
        Ok(())
    }

    fn check_new(&self, name: &str, class: &str) -> Result<(), RibError> {
        validate_name(name, &self.cfg)?;
        if name == ROOT {
            return Err(RibError::Root("created"));
        }
        self.check_class(name, class)?;
        if let Some(n) = self.nodes.get(name) {
            return Err(RibError::AlreadyExists {
                name: name.to_string(),
                class: n.obj.class.clone(),
            });
        }
        Ok(())
    }

    fn insert(&mut self, name: &str, class: &str, value: ObjValue, owner: OwnerId) -> u64 {
        let instance = self.next_instance;
        self.next_instance += 1;
        if let Some(p) = parent_of(name).and_then(|p| self.nodes.get_mut(p)) {
            p.children.insert(name.to_string());
        }
        self.nodes.insert(
            name.to_string(),
            Node {
                obj: RibObject {
                    class: class.to_string(),
                    name: name.to_string(),
                    instance,
                    value,
                    owner,
                },
                children: BTreeSet::new(),
            },
        );
        instance
    }

    /// Creates object `name` of `class` with `value`, owned by `owner`; its
    /// parent must exist. Returns the new instance number.
    pub fn create(
        &mut self,
        name: &str,
        class: &str,
        value: ObjValue,
        owner: OwnerId,
    ) -> Result<u64, RibError> {
        self.check_new(name, class)?;
        let parent = parent_of(name).unwrap_or(ROOT);
        if !self.nodes.contains_key(parent) {
            return Err(RibError::ParentMissing {
                name: name.to_string(),
                parent: parent.to_string(),
            });
        }
        if self.len() >= self.cfg.max_objects {
            return Err(RibError::Full {
                name: name.to_string(),
                max: self.cfg.max_objects,
            });
        }
        Ok(self.insert(name, class, value, owner))
    }

    /// Like [`Rib::create`], but missing ancestors are created first as
    /// objects of class [`CONTAINER_CLASS`] with no value, owned by `owner`.
    /// All or nothing: if everything does not fit, nothing is created.
    pub fn create_with_parents(
        &mut self,
        name: &str,
        class: &str,
        value: ObjValue,
        owner: OwnerId,
    ) -> Result<u64, RibError> {
        self.check_new(name, class)?;
        let missing: Vec<String> = ancestors(name)
            .skip(1)
            .take_while(|a| !self.nodes.contains_key(*a))
            .map(str::to_string)
            .collect();
        if self.len() + missing.len() + 1 > self.cfg.max_objects {
            return Err(RibError::Full {
                name: name.to_string(),
                max: self.cfg.max_objects,
            });
        }
        for a in missing.iter().rev() {
            self.insert(a, CONTAINER_CLASS, ObjValue::None, owner);
        }
        Ok(self.insert(name, class, value, owner))
    }

    /// Deletes object `name` and its whole subtree. Returns the deleted
    /// objects, the object first, in the order of [`Rib::iter_subtree`].
    pub fn delete(&mut self, name: &str) -> Result<Vec<RibObject>, RibError> {
        validate_name(name, &self.cfg)?;
        if name == ROOT {
            return Err(RibError::Root("deleted"));
        }
        if !self.nodes.contains_key(name) {
            return Err(RibError::NotFound(name.to_string()));
        }
        let names: Vec<String> = self.iter_subtree(name).map(|o| o.name.clone()).collect();
        if let Some(p) = parent_of(name).and_then(|p| self.nodes.get_mut(p)) {
            p.children.remove(name);
        }
        Ok(names
            .iter()
            .filter_map(|n| self.nodes.remove(n))
            .map(|n| n.obj)
            .collect())
    }

    /// Replaces the value of object `name`; returns the old value.
    pub fn write(&mut self, name: &str, value: ObjValue) -> Result<ObjValue, RibError> {
        validate_name(name, &self.cfg)?;
        if name == ROOT {
            return Err(RibError::Root("written"));
        }
        let n = self
            .nodes
            .get_mut(name)
            .ok_or_else(|| RibError::NotFound(name.to_string()))?;
        Ok(std::mem::replace(&mut n.obj.value, value))
    }

    /// Object `name` and its descendants down to `depth` levels below it
    /// (0: the object alone, 1: with its children, [`ALL_LEVELS`]: the whole
    /// subtree), in the order of [`Rib::iter_subtree`].
    pub fn read(&self, name: &str, depth: usize) -> Result<Vec<&RibObject>, RibError> {
        validate_name(name, &self.cfg)?;
        if !self.nodes.contains_key(name) {
            return Err(RibError::NotFound(name.to_string()));
        }
        Ok(self.iter_subtree_depth(name, depth).collect())
    }

    /// The children of object `name`, sorted by name.
    pub fn children(&self, name: &str) -> Result<impl Iterator<Item = &RibObject> + '_, RibError> {
        validate_name(name, &self.cfg)?;
        let n = self
            .nodes
            .get(name)
            .ok_or_else(|| RibError::NotFound(name.to_string()))?;
        Ok(n.children.iter().filter_map(|c| self.get(c)))
    }

    /// Object `name` and all its descendants, depth first, parents before
    /// children, siblings sorted by name. Empty if there is no such object.
    pub fn iter_subtree<'a>(&'a self, name: &str) -> Subtree<'a> {
        self.iter_subtree_depth(name, ALL_LEVELS)
    }

    /// Like [`Rib::iter_subtree`], down to `depth` levels below `name`.
    pub fn iter_subtree_depth<'a>(&'a self, name: &str, depth: usize) -> Subtree<'a> {
        let stack = match self.nodes.get_key_value(name) {
            Some((k, _)) => vec![(k.as_str(), 0)],
            None => Vec::new(),
        };
        Subtree {
            rib: self,
            stack,
            max_depth: depth,
        }
    }

    /// Plain rows for object `name` and its descendants down to `depth`
    /// levels ([`Rib::read`]'s order and depth).
    pub fn snapshot(&self, name: &str, depth: usize) -> Result<Vec<RibEntry>, RibError> {
        Ok(self
            .read(name, depth)?
            .into_iter()
            .map(|o| RibEntry {
                class: o.class.clone(),
                name: o.name.clone(),
                instance: o.instance,
                value_summary: o.value.summary(),
                owner: o.owner.to_string(),
            })
            .collect())
    }

    /// Checks the tree's invariants; panics with a message if one is broken.
    #[cfg(test)]
    fn check_invariants(&self) {
        let mut instances = BTreeSet::new();
        for (k, n) in &self.nodes {
            assert_eq!(k, &n.obj.name);
            assert!(instances.insert(n.obj.instance), "instance reused");
            validate_name(k, &self.cfg).unwrap();
            if let Some(p) = parent_of(k) {
                let parent = self.nodes.get(p).expect("orphan");
                assert!(parent.children.contains(k), "{k} not listed in {p}");
            }
            for c in &n.children {
                assert_eq!(parent_of(c), Some(k.as_str()));
                assert!(self.nodes.contains_key(c), "dangling child {c}");
            }
        }
        assert_eq!(self.iter_subtree(ROOT).count(), self.nodes.len());
        assert!(self.len() <= self.cfg.max_objects);
    }
}

/// Iterator over a subtree: see [`Rib::iter_subtree`].
#[derive(Debug, Clone)]
pub struct Subtree<'a> {
    rib: &'a Rib,
    stack: Vec<(&'a str, usize)>,
    max_depth: usize,
}

impl<'a> Iterator for Subtree<'a> {
    type Item = &'a RibObject;

    fn next(&mut self) -> Option<&'a RibObject> {
        let (name, d) = self.stack.pop()?;
        let node = self.rib.nodes.get(name)?;
        if d < self.max_depth {
            self.stack
                .extend(node.children.iter().rev().map(|c| (c.as_str(), d + 1)));
        }
        Some(&node.obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ENR: OwnerId = OwnerId::ENROLLMENT;

    fn rib() -> Rib {
        let mut r = Rib::default();
        r.create("/difm", "DIFManagement", ObjValue::None, ENR)
            .unwrap();
        r.create("/difm/enr", "Enrollment", ObjValue::None, ENR)
            .unwrap();
        r.create("/difm/enr/neighs", "Neighbors", ObjValue::None, ENR)
            .unwrap();
        r.create(
            "/difm/enr/neighs/pn=beta.net",
            "Neighbor",
            ObjValue::Int(2),
            ENR,
        )
        .unwrap();
        r.create(
            "/difm/enr/neighs/pn=alpha.net",
            "Neighbor",
            ObjValue::Int(1),
            ENR,
        )
        .unwrap();
        r.create("/difm/enr-x", "X", ObjValue::None, ENR).unwrap();
        r.check_invariants();
        r
    }

    fn names<'a>(it: impl IntoIterator<Item = &'a RibObject>) -> Vec<&'a str> {
        it.into_iter().map(|o| o.name.as_str()).collect()
    }

    #[test]
    fn create_get_and_instances() {
        let mut r = rib();
        assert_eq!(r.len(), 6);
        let o = r.get("/difm/enr/neighs/pn=alpha.net").unwrap();
        assert_eq!(o.class, "Neighbor");
        assert_eq!(o.value, ObjValue::Int(1));
        assert_eq!(o.owner, ENR);
        assert_eq!(r.get(ROOT).unwrap().instance, 0);
        let i = r
            .create("/ra", "ResourceAllocator", ObjValue::None, ENR)
            .unwrap();
        assert_eq!(i, 7, "instances are assigned in order");
        r.delete("/ra").unwrap();
        let j = r
            .create("/ra", "ResourceAllocator", ObjValue::None, ENR)
            .unwrap();
        assert_eq!(j, 8, "instances are never reused");
        assert_eq!(
            r.create("/ra", "Other", ObjValue::None, ENR),
            Err(RibError::AlreadyExists {
                name: "/ra".into(),
                class: "ResourceAllocator".into()
            })
        );
    }

    #[test]
    fn parent_must_exist_unless_asked() {
        let mut r = Rib::default();
        let e = r
            .create("/ra/qoscubes/id=2", "QoSCube", ObjValue::None, ENR)
            .unwrap_err();
        assert_eq!(
            e,
            RibError::ParentMissing {
                name: "/ra/qoscubes/id=2".into(),
                parent: "/ra/qoscubes".into()
            }
        );
        assert!(e.to_string().contains("/ra/qoscubes does not exist"));
        assert!(r.is_empty());
        r.create_with_parents("/ra/qoscubes/id=2", "QoSCube", ObjValue::Int(2), ENR)
            .unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r.get("/ra").unwrap().class, CONTAINER_CLASS);
        assert_eq!(r.get("/ra/qoscubes").unwrap().value, ObjValue::None);
        assert_eq!(r.get("/ra/qoscubes/id=2").unwrap().class, "QoSCube");
        // Existing parents are left alone.
        r.create_with_parents("/ra/qoscubes/id=3", "QoSCube", ObjValue::Int(3), ENR)
            .unwrap();
        assert_eq!(r.len(), 4);
        r.check_invariants();
    }

    #[test]
    fn invalid_names_say_what_is_wrong() {
        let mut r = Rib::new(Config {
            max_name_len: 20,
            max_depth: 3,
            ..Config::default()
        });
        let problem = |r: &mut Rib, n: &str| match r.create(n, "C", ObjValue::None, ENR) {
            Err(RibError::InvalidName { problem, .. }) => problem,
            other => panic!("{n:?}: {other:?}"),
        };
        assert_eq!(problem(&mut r, ""), NameProblem::Empty);
        assert_eq!(problem(&mut r, "difm"), NameProblem::NotAbsolute);
        assert_eq!(problem(&mut r, "/a//b"), NameProblem::EmptySegment(3));
        assert_eq!(problem(&mut r, "/a/"), NameProblem::EmptySegment(2));
        assert_eq!(
            problem(&mut r, "/a\tb"),
            NameProblem::NonPrintable { at: 2, ch: '\t' }
        );
        assert_eq!(
            problem(&mut r, "/a\u{7f}"),
            NameProblem::NonPrintable {
                at: 2,
                ch: '\u{7f}'
            }
        );
        assert_eq!(
            problem(&mut r, "/aaaaaaaaaaaaaaaaaaaaaaaaa"),
            NameProblem::TooLong { len: 26, max: 20 }
        );
        assert_eq!(
            problem(&mut r, "/a/b/c/d"),
            NameProblem::TooDeep { depth: 4, max: 3 }
        );
        let e = r.create("/a b", "C", ObjValue::None, ENR);
        assert!(e.is_ok(), "spaces are printable: {e:?}");
        let msg = r
            .create("x/y", "C", ObjValue::None, ENR)
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "invalid object name \"x/y\": it does not start with '/'"
        );
        assert!(matches!(
            r.create("/c", "", ObjValue::None, ENR),
            Err(RibError::InvalidClass { .. })
        ));
        assert!(matches!(
            r.read("/a//", 0),
            Err(RibError::InvalidName { .. })
        ));
    }

    #[test]
    fn root_is_fixed() {
        let mut r = rib();
        assert_eq!(
            r.create(ROOT, "X", ObjValue::None, ENR),
            Err(RibError::Root("created"))
        );
        assert_eq!(r.delete(ROOT), Err(RibError::Root("deleted")));
        assert_eq!(
            r.write(ROOT, ObjValue::Int(1)),
            Err(RibError::Root("written"))
        );
        assert_eq!(r.get(ROOT).unwrap().class, ROOT_CLASS);
    }

    #[test]
    fn delete_removes_the_subtree() {
        let mut r = rib();
        let gone = r.delete("/difm/enr").unwrap();
        assert_eq!(
            names(&gone),
            [
                "/difm/enr",
                "/difm/enr/neighs",
                "/difm/enr/neighs/pn=alpha.net",
                "/difm/enr/neighs/pn=beta.net"
            ]
        );
        assert_eq!(r.len(), 2);
        assert!(
            r.contains("/difm/enr-x"),
            "a sibling with a longer name stays"
        );
        assert_eq!(names(r.children("/difm").unwrap()), ["/difm/enr-x"]);
        assert_eq!(
            r.delete("/difm/enr"),
            Err(RibError::NotFound("/difm/enr".into()))
        );
        r.check_invariants();
    }

    #[test]
    fn write_read_children_and_order() {
        let mut r = rib();
        assert_eq!(
            r.write("/difm/enr/neighs/pn=beta.net", ObjValue::Str("b".into())),
            Ok(ObjValue::Int(2))
        );
        assert_eq!(
            r.get("/difm/enr/neighs/pn=beta.net").unwrap().value,
            ObjValue::Str("b".into())
        );
        assert_eq!(
            r.write("/nope", ObjValue::None),
            Err(RibError::NotFound("/nope".into()))
        );
        assert_eq!(names(r.read("/difm", 0).unwrap()), ["/difm"]);
        assert_eq!(
            names(r.read("/difm", 1).unwrap()),
            ["/difm", "/difm/enr", "/difm/enr-x"]
        );
        // Pre-order: a node's descendants come right after it, even where
        // byte order would put "/difm/enr-x" between them.
        assert_eq!(
            names(r.iter_subtree(ROOT)),
            [
                "/",
                "/difm",
                "/difm/enr",
                "/difm/enr/neighs",
                "/difm/enr/neighs/pn=alpha.net",
                "/difm/enr/neighs/pn=beta.net",
                "/difm/enr-x"
            ]
        );
        assert_eq!(r.iter_subtree("/none").count(), 0);
        assert_eq!(
            names(r.children("/difm/enr/neighs").unwrap()),
            [
                "/difm/enr/neighs/pn=alpha.net",
                "/difm/enr/neighs/pn=beta.net"
            ]
        );
        assert!(matches!(r.children("/x"), Err(RibError::NotFound(_))));
        assert_eq!(r.read("/x", 0), Err(RibError::NotFound("/x".into())));
    }

    #[test]
    fn max_objects_is_enforced() {
        let mut r = Rib::new(Config {
            max_objects: 3,
            ..Config::default()
        });
        r.create("/a", "C", ObjValue::None, ENR).unwrap();
        r.create("/a/b", "C", ObjValue::None, ENR).unwrap();
        // Needs two more objects (/x and /x/y): refused whole.
        assert_eq!(
            r.create_with_parents("/x/y", "C", ObjValue::None, ENR),
            Err(RibError::Full {
                name: "/x/y".into(),
                max: 3
            })
        );
        assert!(!r.contains("/x"), "nothing half-created");
        r.create("/c", "C", ObjValue::None, ENR).unwrap();
        let e = r.create("/d", "C", ObjValue::None, ENR).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot create /d: the RIB is full (3 objects)"
        );
        r.delete("/c").unwrap();
        r.create("/d", "C", ObjValue::None, ENR).unwrap();
        r.check_invariants();
    }

    #[test]
    fn snapshot_rows_and_summaries() {
        let mut r = Rib::default();
        let fso = rina_wire::cdap::FlowStateObject {
            name: "a".into(),
            cost: 1,
            ..Default::default()
        };
        let enc = ObjValue::encoded("flowStateObject_t", &fso);
        let n = fso.encode_to_vec().len();
        r.create(
            "/a",
            "A",
            ObjValue::Bytes(vec![0xde, 0xad]),
            OwnerId::ROUTING,
        )
        .unwrap();
        r.create(
            "/a/big",
            "B",
            ObjValue::Bytes(vec![7; 100]),
            OwnerId::ROUTING,
        )
        .unwrap();
        r.create("/a/e", "FlowStateObject", enc, OwnerId::ROUTING)
            .unwrap();
        r.create("/a/s", "S", ObjValue::Str("hello".into()), OwnerId::ROUTING)
            .unwrap();
        r.create("/a/t", "T", ObjValue::Bool(true), OwnerId::ROUTING)
            .unwrap();
        let s = r.snapshot("/a", ALL_LEVELS).unwrap();
        assert_eq!(
            s[0],
            RibEntry {
                class: "A".into(),
                name: "/a".into(),
                instance: 1,
                value_summary: "dead".into(),
                owner: "routing".into(),
            }
        );
        assert_eq!(
            s[1].value_summary,
            format!("{}… (100 bytes)", "07".repeat(32))
        );
        assert_eq!(
            s[2].value_summary,
            format!("<flowStateObject_t, {n} bytes>")
        );
        assert_eq!(s[3].value_summary, "hello");
        assert_eq!(s[4].value_summary, "true");
        assert_eq!(r.snapshot(ROOT, 0).unwrap()[0].owner, "rib-daemon");
        assert_eq!(r.snapshot(ROOT, ALL_LEVELS).unwrap().len(), 6);
        let long = ObjValue::Str("é".repeat(STR_SUMMARY_LEN + 60)).summary();
        assert!(long.starts_with(&"é".repeat(STR_SUMMARY_LEN)));
        assert!(!long.starts_with(&"é".repeat(STR_SUMMARY_LEN + 1)));
        assert!(long.ends_with(&format!("… ({} bytes)", 2 * (STR_SUMMARY_LEN + 60))));
    }

    #[test]
    fn cdap_values_convert() {
        let cases = [
            ObjValue::Bytes(vec![1, 2]),
            ObjValue::Str("x".into()),
            ObjValue::Int(-5),
            ObjValue::Bool(false),
        ];
        for v in cases {
            assert_eq!(ObjValue::from_cdap(v.to_cdap().as_ref()), v);
        }
        assert_eq!(ObjValue::None.to_cdap(), None);
        assert_eq!(ObjValue::from_cdap(None), ObjValue::None);
        assert_eq!(
            ObjValue::from_cdap(Some(&ObjVal::from(3i32))),
            ObjValue::Int(3)
        );
        let e = ObjValue::Encoded {
            class: "c".into(),
            bytes: vec![9],
        };
        assert_eq!(
            ObjValue::from_cdap(e.to_cdap().as_ref()),
            ObjValue::Bytes(vec![9])
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Create(String),
        CreateAll(String),
        Delete(String),
        Write(String),
    }

    fn path() -> impl Strategy<Value = String> {
        proptest::collection::vec(prop_oneof!["a", "b", "c=1"], 0..5).prop_map(|segs| {
            if segs.is_empty() {
                ROOT.to_string()
            } else {
                segs.iter().map(|s| format!("/{s}")).collect()
            }
        })
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            path().prop_map(Op::Create),
            path().prop_map(Op::CreateAll),
            path().prop_map(Op::Delete),
            path().prop_map(Op::Write),
        ]
    }

    proptest! {
        #[test]
        fn random_ops_keep_the_tree_whole(ops in proptest::collection::vec(op(), 0..60)) {
            let mut r = Rib::new(Config { max_objects: 12, max_depth: 3, ..Config::default() });
            for op in ops {
                let before = r.len();
                match op {
                    Op::Create(p) => {
                        if r.create(&p, "C", ObjValue::None, ENR).is_ok() {
                            prop_assert_eq!(r.len(), before + 1);
                        }
                    }
                    Op::CreateAll(p) => {
                        let _ = r.create_with_parents(&p, "C", ObjValue::Int(1), ENR);
                        prop_assert!(r.len() >= before);
                    }
                    Op::Delete(p) => {
                        let n = r.iter_subtree(&p).count();
                        if let Ok(gone) = r.delete(&p) {
                            prop_assert_eq!(gone.len(), n);
                            prop_assert_eq!(r.len(), before - n);
                            prop_assert!(r.iter_subtree(&p).next().is_none());
                        }
                    }
                    Op::Write(p) => {
                        let _ = r.write(&p, ObjValue::Bytes(vec![1]));
                        prop_assert_eq!(r.len(), before);
                    }
                }
                r.check_invariants();
            }
        }

        #[test]
        fn validate_name_never_panics(s in "\\PC{0,40}|[/a\\t]{0,10}") {
            let cfg = Config { max_name_len: 30, max_depth: 4, ..Config::default() };
            if validate_name(&s, &cfg).is_ok() {
                prop_assert!(s.starts_with('/'));
                prop_assert!(s == ROOT || !s.split('/').skip(1).any(str::is_empty));
                let mut up = s.as_str();
                while let Some(p) = parent_of(up) {
                    prop_assert!(validate_name(p, &cfg).is_ok());
                    up = p;
                }
            }
        }
    }
}
