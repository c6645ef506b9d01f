# The two commands a newcomer types are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
CARGO ?= cargo
SURGE := target/release/surge

.PHONY: setup build release install deb demo test test-rust test-python test-slowpfs test-netpfs lint fmt clean

setup:
	@./scripts/setup.sh

build: setup
	$(CARGO) build --workspace

release: setup
	$(CARGO) build --release -p surge-cli -p surge-datawarp -p surge-preload

# For admins: `surge` (and /sbin/mount.fuse.surge, mount(8)'s helper: `mount -t fuse.surge`,
# fstab), libdatawarp (codes link with -ldatawarp) and its header, and the interposition
# library (lib/surge/libsurge_preload.so, docs/DATAPLANE.md "The preload path") under $(PREFIX)
# (staged under $(DESTDIR) when packaging), and the passthrough helper's systemd unit, enabled
# and started where systemd runs (HELPER=no: installed only): users' mounts then get the fast
# tier's speed (scripts/install-helper.sh says what it did). The units of the manager, server,
# agent and mover are installed, not enabled, and /etc/surge/surge.toml if there is none
# (docs/INSTALL.md). A Debian host: `make deb`.
PREFIX ?= /usr/local
UNIT_DIR ?= /etc/systemd/system
HELPER ?= yes
install: release
	install -D -m 0755 target/release/surge $(DESTDIR)$(PREFIX)/bin/surge
	install -d $(DESTDIR)/sbin && ln -sf $(PREFIX)/bin/surge $(DESTDIR)/sbin/mount.fuse.surge
	install -D -m 0755 target/release/libdatawarp.so $(DESTDIR)$(PREFIX)/lib/libdatawarp.so
	install -D -m 0644 crates/surge-datawarp/include/datawarp.h $(DESTDIR)$(PREFIX)/include/datawarp.h
	install -D -m 0755 target/release/libsurge_preload.so $(DESTDIR)$(PREFIX)/lib/surge/libsurge_preload.so
	./scripts/install-helper.sh "$(PREFIX)" "$(UNIT_DIR)" "$(DESTDIR)" "$(HELPER)"
	for u in manager server agent mover; do \
	    sed "s|/usr/local/bin/surge|$(PREFIX)/bin/surge|" contrib/systemd/surge-$$u.service > target/surge-$$u.service && \
	    install -D -m 0644 target/surge-$$u.service $(DESTDIR)$(UNIT_DIR)/surge-$$u.service; done
	[ -e $(DESTDIR)/etc/surge/surge.toml ] || install -D -m 0644 contrib/surge.toml $(DESTDIR)/etc/surge/surge.toml
	@echo "daemon units installed, not enabled: see docs/INSTALL.md (surge doctor --role ROLE, then systemctl enable --now surge-ROLE)"

# The Debian package (target/debian/surge_<version>_<arch>.deb): binary, libdatawarp, header,
# systemd units, /etc/surge/surge.toml; its post-install creates the service user `surge`
# (packaging/deb/build.sh; dpkg-deb, no network). docs/INSTALL.md.
deb: release
	./packaging/deb/build.sh --surge target/release/surge --libdatawarp target/release/libdatawarp.so \
		--preload target/release/libsurge_preload.so --out target/debian

# Set up everything and run the main job on the embedded default.
demo: release
	./scripts/demo.sh

lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# tests/preload.rs runs programs with the interposition library: `cargo test` builds it
# (crates/surge-preload/tests/exports.rs needs it) into target/debug/deps.
test-rust: setup
	$(CARGO) test --workspace

# The `surge` Python package: wheel built with maturin, pytest tests (scripts/test-python.sh).
test-python: setup
	CARGO=$(CARGO) ./scripts/test-python.sh

# The throttled slow-PFS directory benchmarks of type=cache use (contrib/slowpfs; root).
test-slowpfs:
	./contrib/slowpfs/test.sh

# The network PFS (GlusterFS over a shaped, delayed veth link: contrib/netpfs; root).
test-netpfs:
	./contrib/netpfs/test.sh

# The whole test suite, as CI runs it.
test: lint test-rust test-python test-slowpfs test-netpfs

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
