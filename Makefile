# kvfs — see README.md. Every target installs what it needs.
SHELL := /bin/bash
GO ?= go
BIN := bin/kvfs

.PHONY: all build deps test check unit fuzz test-python test-nvme test-fuse run bench clean install uninstall

all: build

build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/kvfs

deps:
	@bash scripts/deps.sh
	$(GO) mod download

check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

unit: deps
	$(GO) test -race -count=1 -timeout 20m ./...

# Short runs of every fuzz target (FUZZTIME each); see scripts/fuzz.sh.
FUZZTIME ?= 5s
fuzz:
	FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

# The Python client installed with `pip install ./python` into a venv under
# out/ and its pytest suite run against that install and a real mount, with
# torch and transformers (python/requirements-test.txt) from a venv kept
# outside the checkout and reused while that file is unchanged; see
# scripts/test-python.sh.
test-python: deps
	GO=$(GO) bash scripts/test-python.sh

# NVMe passthrough engine tests inside QEMU's emulated NVMe (FDP and plain
# namespaces, power-cut crash test); see integration/nvme/run.sh.
test-nvme:
	bash integration/nvme/run.sh

# FUSE tests through real kernel mounts (need root and /dev/fuse).
test-fuse: deps
	$(GO) test -race -count=1 ./fs/ ./integration/fuse/

# Mount the default store (/var/lib/kvfs/default.kvfs, created on first use)
# at /mnt/kvcache in the foreground; see scripts/run.sh.
run: build
	bash scripts/run.sh

test: deps check unit test-python fuzz test-nvme

# make install: kvfs to $(BINDIR), the mount(8) helper mount.fuse.kvfs to
# $(SBINDIR) (mount -t fuse.kvfs, /etc/fstab), the systemd unit kvfs@.service
# to $(UNITDIR). PREFIX and DESTDIR (staged installs) are honoured; see
# README.md "Mounting at boot". make uninstall removes the same files.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
SBINDIR ?= /sbin
UNITDIR ?= $(PREFIX)/lib/systemd/system
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/kvfs
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR)
	sed 's|^KVFS_DEFAULT=.*|KVFS_DEFAULT=$(BINDIR)/kvfs|' dist/mount.fuse.kvfs > $(DESTDIR)$(SBINDIR)/mount.fuse.kvfs
	chmod 0755 $(DESTDIR)$(SBINDIR)/mount.fuse.kvfs
	sed 's|@BINDIR@|$(BINDIR)|g' dist/kvfs@.service > $(DESTDIR)$(UNITDIR)/kvfs@.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/kvfs@.service
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/kvfs $(DESTDIR)$(SBINDIR)/mount.fuse.kvfs $(DESTDIR)$(UNITDIR)/kvfs@.service
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi

clean:
	rm -rf bin out
