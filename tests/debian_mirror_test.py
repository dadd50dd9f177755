#!/usr/bin/env python3
"""scripts/debian-mirror picks the Debian archive (and security archive) this host's apt sources
name, in both formats, and falls back to Debian's own only when they name none. Runs the script
over apt folders made here (--etc-apt), as scripts/setup-bullseye and setup-pytorch214 run it."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "debian-mirror")


def mirror(files, *flags):
    """The script's answer over an apt folder holding `files` (relative path -> text)."""
    with tempfile.TemporaryDirectory() as etc_apt:
        os.mkdir(os.path.join(etc_apt, "sources.list.d"))
        for name, text in files.items():
            with open(os.path.join(etc_apt, name), "w", encoding="utf-8") as f:
                f.write(text)
        result = subprocess.run([sys.executable, SCRIPT, "--etc-apt", etc_apt, *flags],
                                capture_output=True, text=True, check=True)
        return result.stdout.strip()


# This machine's own layout (Debian 12 in a cloud image): deb822, a comment inside a paragraph,
# and other projects' sources, one of them disabled by renaming it.
DEB822_HOST = {
    "sources.list.d/debian.sources": """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
""",
    "sources.list.d/google-cloud-sdk.list.disabled-by-farm":
        "deb http://elsewhere.example/debian bookworm main\n",
    "sources.list.d/nodesource.sources": """Types: deb
URIs: https://deb.nodesource.example/node_20.x
Suites: nodistro
Components: main
""",
}


class DebianMirrorTest(unittest.TestCase):
    def test_deb822_sources(self):
        self.assertEqual(mirror(DEB822_HOST), "http://mirror.example/debian")
        self.assertEqual(mirror(DEB822_HOST, "--security"), "http://mirror.example/debian-security")

    def test_one_line_sources_with_options_and_comments(self):
        files = {"sources.list": """# deb http://commented.example/debian bookworm main
deb-src http://source-only.example/debian bookworm main
deb [ arch=amd64 signed-by=/usr/share/keyrings/k.gpg ] http://local:3142/deb.debian.org/debian/ bookworm main contrib
deb [arch=amd64] http://local:3142/security.debian.org/debian-security bookworm-security main
"""}
        self.assertEqual(mirror(files), "http://local:3142/deb.debian.org/debian")
        self.assertEqual(mirror(files, "--security"),
                         "http://local:3142/security.debian.org/debian-security")

    def test_security_derived_from_the_archive_when_not_named(self):
        files = {"sources.list.d/local.list": "deb http://mirror.lan/debian sid main\n"}
        self.assertEqual(mirror(files), "http://mirror.lan/debian")
        self.assertEqual(mirror(files, "--security"), "http://mirror.lan/debian-security")
        odd = {"sources.list": "deb http://mirror.lan/pub/archive bookworm-updates main\n"}
        self.assertEqual(mirror(odd), "http://mirror.lan/pub/archive")
        self.assertEqual(mirror(odd, "--security"), "http://security.debian.org/debian-security")

    def test_debian_10_security_suite_and_a_continuation_line(self):
        files = {"sources.list.d/old.sources": """Types: deb
URIs: http://old.example/debian-security
Suites: buster/updates
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: http://old.example/debian
Suites: buster
"""}
        self.assertEqual(mirror(files), "http://old.example/debian")
        self.assertEqual(mirror(files, "--security"), "http://old.example/debian-security")

    def test_disabled_foreign_and_unfetchable_sources_are_passed_over(self):
        files = {
            "sources.list": "deb cdrom:[Debian 12]/ bookworm main\n"
                            "deb http://archive.ubuntu.example/ubuntu jammy main\n",
            "sources.list.d/a.sources": "Types: deb\nURIs: http://off.example/debian\n"
                                        "Suites: bookworm\nEnabled: no\n",
            "sources.list.d/b.sources": "Types: deb-src deb\nURIs: mirror+file:/etc/m.txt "
                                        "http://on.example/debian\nSuites: trixie\n",
        }
        self.assertEqual(mirror(files), "http://on.example/debian")

    def test_the_default_when_the_host_names_no_debian_archive(self):
        self.assertEqual(mirror({}), "http://deb.debian.org/debian")
        self.assertEqual(mirror({}, "--security"), "http://deb.debian.org/debian-security")
        ubuntu = {"sources.list": "deb http://archive.ubuntu.example/ubuntu focal main\n"}
        self.assertEqual(mirror(ubuntu), "http://deb.debian.org/debian")

    def test_apt_reads_sources_list_first_then_the_folder_in_name_order(self):
        files = {
            "sources.list": "",
            "sources.list.d/b.list": "deb http://second.example/debian bookworm main\n",
            "sources.list.d/a.sources": "Types: deb\nURIs: http://first.example/debian\n"
                                        "Suites: bookworm\n",
        }
        self.assertEqual(mirror(files), "http://first.example/debian")
        files["sources.list"] = "deb http://main.example/debian bookworm main\n"
        self.assertEqual(mirror(files), "http://main.example/debian")


if __name__ == "__main__":
    unittest.main()
