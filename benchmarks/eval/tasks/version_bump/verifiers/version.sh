set -e
grep -qx 'version = 1.3.0' setup.cfg
grep -qx '__version__ = "1.3.0"' mypkg/__init__.py
! grep -q 1.2.9 setup.cfg mypkg/__init__.py
