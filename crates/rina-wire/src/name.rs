//! RINA application names.
//!
//! An application process name (APN) has four parts: process name, process
//! instance, entity name and entity instance. They are written
//! `name/instance/entity/instance`; trailing parts may be left out and any
//! part but the first may be empty (`echo`, `echo/1`, `echo//data`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Longest name, written out, in bytes. It fits the one-byte protocol address
/// length of ARP, which the shim DIF over Ethernet resolves names with.
pub const MAX_NAME_LEN: usize = 255;

/// Why a string is not a valid application name.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// The process name (first part) is empty.
    #[error("the process name (first part) is empty")]
    EmptyProcessName,
    /// More than four `/`-separated parts.
    #[error("a name has at most four parts (name/instance/entity/instance), found {0}")]
    TooManyParts(usize),
    /// The name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("name is {0} bytes long, at most {MAX_NAME_LEN} are allowed")]
    TooLong(usize),
    /// The name holds a control character or white space.
    #[error("name contains the character {0:?}, which is not allowed")]
    BadChar(char),
    /// A name given part by part reads as another name in its text form: a
    /// part holds `/`, which separates the parts.
    #[error("its text form {0:?} reads as another name (a part may not hold '/', which separates the parts)")]
    ReadsAsAnother(String),
}

/// A four-part RINA application name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AppName {
    /// Process name; never empty in a valid name.
    pub process_name: String,
    /// Process instance.
    pub process_instance: String,
    /// Entity name.
    pub entity_name: String,
    /// Entity instance.
    pub entity_instance: String,
}

impl AppName {
    /// A name with only a process name.
    pub fn new(process_name: &str) -> Result<Self, NameError> {
        process_name.parse()
    }

    /// Whether a name given part by part (as protocol messages carry it)
    /// is valid: its text form parses ([`FromStr`]) back to the same four
    /// parts. A part holding `/` is [`NameError::ReadsAsAnother`].
    pub fn check(&self) -> Result<(), NameError> {
        let text = self.to_string();
        let parts = [
            &self.process_name,
            &self.process_instance,
            &self.entity_name,
            &self.entity_instance,
        ];
        if parts.iter().any(|p| p.contains('/')) {
            return Err(NameError::ReadsAsAnother(text));
        }
        match text.parse::<AppName>()? {
            back if back == *self => Ok(()),
            _ => Err(NameError::ReadsAsAnother(text)),
        }
    }
}

impl FromStr for AppName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, NameError> {
        if s.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong(s.len()));
        }
        if let Some(c) = s.chars().find(|c| c.is_control() || c.is_whitespace()) {
            return Err(NameError::BadChar(c));
        }
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() > 4 {
            return Err(NameError::TooManyParts(parts.len()));
        }
        if parts[0].is_empty() {
            return Err(NameError::EmptyProcessName);
        }
        let part = |i: usize| parts.get(i).copied().unwrap_or("").to_string();
        Ok(AppName {
            process_name: part(0),
            process_instance: part(1),
            entity_name: part(2),
            entity_instance: part(3),
        })
    }
}

impl fmt::Display for AppName {
    /// Writes `name/instance/entity/instance`, leaving out empty trailing parts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            &self.process_name,
            &self.process_instance,
            &self.entity_name,
            &self.entity_instance,
        ];
        let last = parts.iter().rposition(|p| !p.is_empty()).unwrap_or(0);
        for (i, p) in parts[..=last].iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            f.write_str(p)?;
        }
        Ok(())
    }
}

impl Serialize for AppName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AppName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_all_forms() {
        let n: AppName = "echo".parse().unwrap();
        assert_eq!(n.process_name, "echo");
        assert_eq!(n.to_string(), "echo");
        let n: AppName = "echo//data/7".parse().unwrap();
        assert_eq!(n.process_instance, "");
        assert_eq!(n.entity_name, "data");
        assert_eq!(n.entity_instance, "7");
        assert_eq!(n.to_string(), "echo//data/7");
        // Trailing empty parts are not written back.
        assert_eq!("a/1//".parse::<AppName>().unwrap().to_string(), "a/1");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!("".parse::<AppName>(), Err(NameError::EmptyProcessName));
        assert_eq!("/x".parse::<AppName>(), Err(NameError::EmptyProcessName));
        assert_eq!(
            "a/b/c/d/e".parse::<AppName>(),
            Err(NameError::TooManyParts(5))
        );
        assert_eq!("a b".parse::<AppName>(), Err(NameError::BadChar(' ')));
        assert!(matches!(
            "x".repeat(300).parse::<AppName>(),
            Err(NameError::TooLong(300))
        ));
    }

    #[test]
    fn check_refuses_parts_that_read_as_others() {
        let n = |a: &str, b: &str, c: &str, d: &str| AppName {
            process_name: a.into(),
            process_instance: b.into(),
            entity_name: c.into(),
            entity_instance: d.into(),
        };
        assert_eq!(n("perf", "1", "data", "7").check(), Ok(()));
        assert_eq!(n("echo", "", "data", "").check(), Ok(()));
        assert_eq!(
            n("admin/1", "", "", "").check(),
            Err(NameError::ReadsAsAnother("admin/1".into()))
        );
        assert_eq!(
            n("perf", "", "data/7", "").check(),
            Err(NameError::ReadsAsAnother("perf//data/7".into()))
        );
        assert_eq!(n("", "1", "", "").check(), Err(NameError::EmptyProcessName));
        assert_eq!(n("a b", "", "", "").check(), Err(NameError::BadChar(' ')));
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(
            a in "[a-z0-9.]{1,20}", b in "[a-z0-9]{0,5}",
            c in "[a-z0-9]{0,5}", d in "[a-z0-9]{0,5}",
        ) {
            let n = AppName { process_name: a, process_instance: b, entity_name: c, entity_instance: d };
            prop_assert_eq!(n.to_string().parse::<AppName>().unwrap(), n);
        }

        #[test]
        fn check_never_panics(
            a in "\\PC{0,12}", b in "[a/]{0,3}", c in "\\PC{0,4}", d in "[/ x]{0,3}",
        ) {
            let n = AppName { process_name: a, process_instance: b, entity_name: c, entity_instance: d };
            if n.check().is_ok() {
                prop_assert_eq!(n.to_string().parse::<AppName>().unwrap(), n);
            }
        }

        #[test]
        fn parse_never_panics(s in any::<String>()) {
            let _ = s.parse::<AppName>();
        }
    }
}
