//! A small CA for `raftmq cert`, `raftmq dev --secure`, the tests and the
//! jepsen harness: a self-signed root and the leaf certificates it signs,
//! as PEM.
//!
//! A cluster with a PKI of its own brings certificates from it instead;
//! they need only the names described in [`super::identity`] (and, for
//! every server, the DNS names or IP addresses it is dialled at).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};

/// A certificate and its private key, PEM-encoded.
#[derive(Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A CA that signs leaves.
pub struct Ca {
    pem: Pem,
    issuer: Issuer<'static, KeyPair>,
    /// When the CA expires: no leaf it signs outlives it.
    not_after: time::OffsetDateTime,
}

fn err(e: rcgen::Error) -> String {
    format!("certificate generation: {e}")
}

/// Sets `params` to be valid from a day ago (clocks differ) for `days`
/// days; `None` keeps rcgen's default (valid until the year 4096), which
/// `raftmq dev --secure` and the tests use.
fn validity(params: &mut CertificateParams, days: Option<u32>) {
    if let Some(days) = days {
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(i64::from(days));
    }
}

/// When the certificate in `pem` expires.
fn expiry(pem: &str) -> Result<time::OffsetDateTime, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("the CA certificate: {e}"))?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der).map_err(|e| format!("the CA certificate: {e}"))?;
    time::OffsetDateTime::from_unix_timestamp(x509.validity().not_after.timestamp())
        .map_err(|e| format!("the CA certificate's expiry: {e}"))
}

impl Ca {
    /// A new root with a fresh ECDSA P-256 key.
    pub fn new(name: &str) -> Result<Ca, String> {
        Ca::valid_for(name, None)
    }

    /// [`Ca::new`], valid for `days` days (`None`: without end).
    pub fn valid_for(name: &str, days: Option<u32>) -> Result<Ca, String> {
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::default();
        validity(&mut params, days);
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(err)?;
        let not_after = params.not_after;
        Ok(Ca {
            pem: Pem {
                cert: cert.pem(),
                key: key.serialize_pem(),
            },
            issuer: Issuer::new(params, key),
            not_after,
        })
    }

    /// A CA made before, from its certificate and key (PEM).
    pub fn load(pem: Pem) -> Result<Ca, String> {
        let key = KeyPair::from_pem(&pem.key).map_err(err)?;
        let not_after = expiry(&pem.cert)?;
        let issuer = Issuer::from_ca_cert_pem(&pem.cert, key).map_err(err)?;
        Ok(Ca { pem, issuer, not_after })
    }

    /// The root certificate (what clients trust) and its key.
    pub fn pem(&self) -> &Pem {
        &self.pem
    }

    /// A leaf for `hosts` (DNS names or IP addresses, as dialled), usable
    /// to serve and to call; with `member`, it also names that group's node.
    pub fn leaf(&self, common_name: &str, hosts: &[&str], member: Option<(&str, u64)>) -> Result<Pem, String> {
        self.leaf_valid_for(common_name, hosts, member, None)
    }

    /// [`Ca::leaf`], valid for `days` days (`None`: without end).
    pub fn leaf_valid_for(
        &self,
        common_name: &str,
        hosts: &[&str],
        member: Option<(&str, u64)>,
        days: Option<u32>,
    ) -> Result<Pem, String> {
        if self.not_after <= time::OffsetDateTime::now_utc() {
            return Err(format!("the CA expired on {}: make a new one", self.not_after.date()));
        }
        let key = KeyPair::generate().map_err(err)?;
        let mut params =
            CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).map_err(err)?;
        validity(&mut params, days);
        params.not_after = params.not_after.min(self.not_after);
        params.distinguished_name.push(DnType::CommonName, common_name);
        if let Some((group, node)) = member {
            let uri = super::identity::node_uri(group, node);
            params
                .subject_alt_names
                .push(SanType::URI(uri.try_into().map_err(err)?));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(err)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}
