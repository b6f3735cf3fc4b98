//! `KeyFrom::extract` with the handler's own `Path<(String, u64)>`.

use axum::extract::Path;

use super::path_param::SEGMENT;
use super::*;

#[test]
fn an_extractor_keys_on_the_value_it_reads() {
    let served = Served::new(
        "/{tenant}/o/{id}",
        KeyFrom::extract(|Path((tenant, id)): Path<(String, u64)>| (tenant, id)),
        |Path(read): Path<(String, u64)>| async move { format!("{read:?}") },
    );
    let send = |tenant: &Spelled, id: &Spelled| {
        let uri = format!("/{}/o/{}", write(SEGMENT, tenant), write(DIGITS, id));
        served.outcome(move || Request::post(uri.as_str()).body(Body::empty()).unwrap())
    };
    check_all((pair(3), pair(3)), true, |(tenants, ids)| {
        let a = send(&tenants.0, &ids.0);
        let b = send(&tenants.1, &ids.1);
        refuses_as_the_extractor(&a)?;
        refuses_as_the_extractor(&b)?;
        one_key_per_value(&a, &b)
    });
}
