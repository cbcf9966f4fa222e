//! ACLs, as S3 answers them for a bucket whose ACLs are disabled ("bucket owner enforced"):
//! access follows the gateway's users (`blindfold user`), never grants. ACLs can be read (the
//! owner has full control); setting one that only restates that (`private`,
//! `bucket-owner-full-control`, `bucket-owner-read`) succeeds; any other canned ACL or grant is
//! refused with AccessControlListNotSupported, never accepted and ignored.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result};

/// The canned ACLs that restate what the gateway does anyway.
const PRIVATE: &[&str] = &["private", "bucket-owner-full-control", "bucket-owner-read"];

fn not_supported(what: &str) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::AccessControlListNotSupported,
        format!(
            "{what} cannot be honoured: ACLs are disabled on this gateway, whose buckets and \
             objects are private to its users. Leave the ACL out (or use `private`), and give \
             others access with `blindfold user add NAME --buckets …` (read-only if you like)"
        ),
    )
}

/// Refuses a canned ACL or grant headers that the gateway cannot honour.
pub(super) fn check(canned: Option<&str>, grants: &[Option<&String>]) -> S3Result<()> {
    if let Some(c) = canned.filter(|c| !PRIVATE.contains(c)) {
        return Err(not_supported(&format!("the canned ACL {c:?}")));
    }
    if grants.iter().any(Option::is_some) {
        return Err(not_supported("an ACL grant header (x-amz-grant-*)"));
    }
    Ok(())
}

/// Refuses an ACL document other than the owner's full control alone.
pub(super) fn check_policy(p: Option<&AccessControlPolicy>) -> S3Result<()> {
    let Some(p) = p else { return Ok(()) };
    let only_owner = p.grants.as_ref().is_none_or(|g| {
        g.iter().all(|g| {
            let to_owner = g.grantee.as_ref().is_some_and(|e| {
                e.type_.as_str() == Type::CANONICAL_USER && e.id.as_deref() == Some(OWNER_ID)
            });
            to_owner
                && g.permission.as_ref().is_some_and(|p| p.as_str() == Permission::FULL_CONTROL)
        })
    });
    if only_owner {
        Ok(())
    } else {
        Err(not_supported("an ACL granting anyone but the owner"))
    }
}

/// The owner every bucket and object answers with.
pub(super) const OWNER_ID: &str = "blindfold";

pub(super) fn owner() -> Owner {
    Owner { id: Some(OWNER_ID.into()), display_name: Some(OWNER_ID.into()) }
}

/// The one grant: the owner's full control.
pub(super) fn grants() -> Grants {
    vec![Grant {
        grantee: Some(Grantee {
            type_: Type::from_static(Type::CANONICAL_USER),
            id: Some(OWNER_ID.into()),
            display_name: Some(OWNER_ID.into()),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }]
}
