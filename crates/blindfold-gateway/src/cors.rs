//! CORS: which web pages (origins) a browser lets call the gateway, per bucket.
//!
//! A bucket's rules are a named bucket setting ([`SETTING`]) in trusted state. The HTTP layer
//! answers preflight requests (`OPTIONS` with `Origin` and `Access-Control-Request-Method`)
//! from them without running any S3 operation, and adds the `Access-Control-*` headers to the
//! answer of an ordinary request whose `Origin` a rule allows. CORS only tells browsers what
//! to let pages read; it grants no access: every request is still signed and checked (or
//! reads what a canned ACL or bucket policy makes public).

use serde::{Deserialize, Serialize};

use crate::sharing::matches;

/// The bucket setting holding a bucket's [`Rules`].
pub const SETTING: &str = "cors";
/// Rules in one configuration, as in S3.
pub const MAX_RULES: usize = 100;
/// The most text (origins, methods, headers) one configuration holds, as in S3 (64 KiB).
pub const MAX_BYTES: usize = 64 * 1024;
const METHODS: &[&str] = &["GET", "PUT", "POST", "DELETE", "HEAD"];

/// One CORS rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Its ID (at most 255 characters).
    pub id: Option<String>,
    /// Origins it allows; each may hold one `*`.
    pub origins: Vec<String>,
    /// Methods it allows (GET, PUT, POST, DELETE, HEAD).
    pub methods: Vec<String>,
    /// Request headers a preflight may ask for; each may hold one `*`.
    pub headers: Vec<String>,
    /// Response headers the browser may let the page read.
    pub expose: Vec<String>,
    /// How long a browser may keep a preflight's answer.
    pub max_age: Option<i32>,
}

/// A bucket's CORS rules (the [`SETTING`] document).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// In order: the first that matches answers.
    pub rules: Vec<Rule>,
}

/// What a matching rule lets a browser do: the `Access-Control-*` headers to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// `Access-Control-Allow-Origin`: `*` for a rule that allows every origin, else the origin.
    pub origin: String,
    /// `Access-Control-Allow-Methods`.
    pub methods: String,
    /// `Access-Control-Allow-Headers`: the headers the preflight asked for.
    pub headers: Option<String>,
    /// `Access-Control-Expose-Headers`.
    pub expose: Option<String>,
    /// `Access-Control-Max-Age`.
    pub max_age: Option<i32>,
}

impl Rules {
    /// Checks rules before they are stored; `Err` says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.rules.is_empty() {
            return Err("a CORS configuration has at least one CORSRule".into());
        }
        if self.rules.len() > MAX_RULES {
            return Err(format!("a CORS configuration has at most {MAX_RULES} rules"));
        }
        let size: usize = self
            .rules
            .iter()
            .flat_map(|r| r.origins.iter().chain(&r.methods).chain(&r.headers).chain(&r.expose))
            .map(|s| s.len() + 1)
            .sum();
        if size > MAX_BYTES {
            return Err(format!("a CORS configuration is at most {} KiB", MAX_BYTES / 1024));
        }
        for (n, r) in self.rules.iter().enumerate() {
            let at = |e: String| format!("CORS rule {}: {e}", n + 1);
            if r.id.as_ref().is_some_and(|i| i.len() > 255) {
                return Err(at("an ID is at most 255 characters".into()));
            }
            if r.origins.is_empty() || r.methods.is_empty() {
                return Err(at("AllowedOrigin and AllowedMethod are required".into()));
            }
            if let Some(m) = r.methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
                return Err(at(format!(
                    "Found unsupported HTTP method in CORS config. Unsupported method is {m} \
                     (allowed: GET, PUT, POST, DELETE, HEAD)"
                )));
            }
            for o in r.origins.iter().chain(&r.headers) {
                if o.matches('*').count() > 1 {
                    return Err(at(format!("{o:?} may contain at most one wildcard *")));
                }
            }
        }
        Ok(())
    }

    /// The first rule that allows `origin` to use `method` (with the request headers
    /// `headers`, lower-cased, for a preflight), and what it allows.
    pub fn allow(&self, origin: &str, method: &str, headers: &[String]) -> Option<Allowed> {
        let rule = self.rules.iter().find(|r| {
            r.origins.iter().any(|o| matches(o, origin))
                && r.methods.iter().any(|m| m == method)
                && headers
                    .iter()
                    .all(|h| r.headers.iter().any(|p| matches(&p.to_ascii_lowercase(), h)))
        })?;
        let join = |v: &[String]| (!v.is_empty()).then(|| v.join(", "));
        Some(Allowed {
            origin: if rule.origins.iter().any(|o| o == "*") { "*".into() } else { origin.into() },
            methods: rule.methods.join(", "),
            headers: join(headers),
            expose: join(&rule.expose),
            max_age: rule.max_age,
        })
    }
}

/// The request headers a preflight asks for (`Access-Control-Request-Headers`), lower-cased.
pub fn requested_headers(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(origins: &[&str], methods: &[&str], headers: &[&str]) -> Rule {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        Rule { origins: v(origins), methods: v(methods), headers: v(headers), ..Default::default() }
    }

    #[test]
    fn the_first_rule_that_allows_origin_method_and_headers_answers() {
        let rules = Rules {
            rules: vec![
                rule(&["*suffix"], &["GET"], &[]),
                rule(&["start*end"], &["GET"], &[]),
                rule(&["*.put"], &["PUT"], &["x-amz-*"]),
                rule(&["*"], &["HEAD"], &[]),
            ],
        };
        let allow = |o: &str, m: &str, h: &[&str]| {
            let h: Vec<String> = h.iter().map(|x| x.to_string()).collect();
            rules.allow(o, m, &h).map(|a| (a.origin, a.methods))
        };
        assert_eq!(allow("foo.suffix", "GET", &[]), Some(("foo.suffix".into(), "GET".into())));
        assert_eq!(allow("foo.suffix.get", "GET", &[]), None);
        assert_eq!(allow("start12end", "GET", &[]), Some(("start12end".into(), "GET".into())));
        assert_eq!(allow("0start12end", "GET", &[]), None);
        assert_eq!(allow("foo.put", "GET", &[]), None);
        assert_eq!(
            allow("foo.put", "PUT", &["x-amz-meta-a"]),
            Some(("foo.put".into(), "PUT".into()))
        );
        assert_eq!(allow("foo.put", "PUT", &["authorization"]), None, "a header no rule allows");
        assert_eq!(allow("anything", "HEAD", &[]), Some(("*".into(), "HEAD".into())));
    }

    #[test]
    fn bad_rules_are_refused() {
        assert!(Rules::default().check().is_err());
        let bad = |r: Rule, why: &str| {
            let e = Rules { rules: vec![r] }.check().unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        bad(rule(&["*"], &["PATCH"], &[]), "unsupported HTTP method");
        bad(rule(&["*a*"], &["GET"], &[]), "at most one wildcard");
        bad(rule(&[], &["GET"], &[]), "required");
        let many: Vec<String> = (0..10_000).map(|i| format!("https://{i}.example")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        bad(rule(&many, &["GET"], &[]), "at most 64 KiB");
        assert!(Rules { rules: vec![rule(&["https://a.example"], &["GET"], &["*"])] }
            .check()
            .is_ok());
        assert_eq!(
            requested_headers(Some(" X-Amz-Date, content-type ,")),
            ["x-amz-date", "content-type"]
        );
    }
}
