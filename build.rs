// Rebuild when a migration is added: they are embedded into the binary.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
