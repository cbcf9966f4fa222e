//! ACLs, as the gateway honours them: canned ACLs ([`Canned`]: `private`, `public-read`,
//! `authenticated-read`, and the `bucket-owner-*` ones that restate `private`) on buckets and
//! objects, and the same expressed as an ACL document (the owner's full control, plus READ to
//! the AllUsers or AuthenticatedUsers group). Who may act otherwise follows the gateway's users
//! (`blindfold user`) and bucket policies ([`crate::sharing`]). Any other canned ACL or grant
//! is refused with a message that says what to do, never accepted and ignored.

use std::collections::BTreeMap;

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result};

use super::Gateway;
use crate::sharing::{self, Canned};

const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
const AUTHENTICATED_USERS: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";

fn not_supported(what: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::AccessControlListNotSupported,
        format!(
            "{what} cannot be honoured: this gateway takes the canned ACLs private, public-read \
             and authenticated-read (or the same as an ACL document), not grants to other \
             accounts. Give others access with `blindfold user add NAME --buckets …` or a \
             bucket policy naming the user"
        ),
    )
}

/// The canned ACL a request names (private if none); refuses one the gateway cannot honour
/// and grant headers.
pub(super) fn check(canned: Option<&str>, grants: &[Option<&String>]) -> S3Result<Canned> {
    if grants.iter().any(Option::is_some) {
        return Err(not_supported("an ACL grant header (x-amz-grant-*)"));
    }
    match canned {
        None => Ok(Canned::Private),
        Some(c) => Canned::parse(c)
            .map_err(|why| S3Error::with_message(S3ErrorCode::AccessControlListNotSupported, why)),
    }
}

/// The canned ACL an ACL document amounts to (`None`: no document); refuses any other grant.
pub(super) fn check_policy(p: Option<&AccessControlPolicy>) -> S3Result<Option<Canned>> {
    let Some(p) = p else { return Ok(None) };
    let mut canned = Canned::Private;
    for g in p.grants.iter().flatten() {
        let (Some(e), Some(perm)) = (&g.grantee, &g.permission) else {
            return Err(not_supported("a grant without grantee or permission"));
        };
        let perm = perm.as_str();
        let group = e.uri.as_deref();
        canned = match (e.type_.as_str(), perm, group) {
            (Type::CANONICAL_USER, Permission::FULL_CONTROL, _)
                if e.id.as_deref() == Some(OWNER_ID) =>
            {
                continue
            }
            (Type::GROUP, Permission::READ, Some(ALL_USERS)) => Canned::PublicRead,
            (Type::GROUP, Permission::READ, Some(AUTHENTICATED_USERS))
                if canned != Canned::PublicRead =>
            {
                Canned::AuthenticatedRead
            }
            (Type::GROUP, Permission::READ, Some(AUTHENTICATED_USERS)) => continue,
            _ => return Err(not_supported(&format!("a grant of {perm} to {}", grantee_name(e)))),
        };
    }
    Ok(Some(canned))
}

fn grantee_name(e: &Grantee) -> String {
    e.uri
        .clone()
        .or_else(|| e.id.clone())
        .or_else(|| e.email_address.clone())
        .unwrap_or_else(|| e.type_.as_str().to_owned())
}

/// The owner every bucket and object answers with.
pub(super) const OWNER_ID: &str = "blindfold";

pub(super) fn owner() -> Owner {
    Owner { id: Some(OWNER_ID.into()), display_name: Some(OWNER_ID.into()) }
}

/// The grants of a canned ACL: the owner's full control, and READ to a group for the public
/// ones.
pub(super) fn grants(canned: Canned) -> Grants {
    let mut out = vec![Grant {
        grantee: Some(Grantee {
            type_: Type::from_static(Type::CANONICAL_USER),
            id: Some(OWNER_ID.into()),
            display_name: Some(OWNER_ID.into()),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }];
    let group = match canned {
        Canned::Private => None,
        Canned::PublicRead => Some(ALL_USERS),
        Canned::AuthenticatedRead => Some(AUTHENTICATED_USERS),
    };
    if let Some(uri) = group {
        out.push(Grant {
            grantee: Some(Grantee {
                type_: Type::from_static(Type::GROUP),
                id: None,
                display_name: None,
                email_address: None,
                uri: Some(uri.into()),
            }),
            permission: Some(Permission::from_static(Permission::READ)),
        });
    }
    out
}

/// The metadata entry an object's canned ACL is kept in (removed when private).
pub(super) fn entry(canned: Canned) -> (String, Option<String>) {
    let value = (canned != Canned::Private).then(|| canned.as_str().to_owned());
    (sharing::OBJECT_ACL_KEY.to_owned(), value)
}

/// Gives a new object's metadata map its canned ACL (replacing what a copy brought along).
pub(super) fn apply(map: &mut BTreeMap<String, String>, canned: Canned) {
    crate::lock::apply(map, vec![entry(canned)]);
}

impl Gateway {
    /// A bucket's canned ACL.
    pub(super) fn bucket_acl(&self, bucket: &str) -> S3Result<Canned> {
        sharing::bucket_acl(self.objects.directory(), bucket).map_err(super::s3)
    }

    /// Sets a bucket's canned ACL.
    pub(super) async fn set_bucket_acl(&self, bucket: &str, canned: Canned) -> S3Result<()> {
        let name = (canned != Canned::Private).then(|| canned.as_str());
        self.set_setting(bucket, sharing::ACL, name).await
    }
}
