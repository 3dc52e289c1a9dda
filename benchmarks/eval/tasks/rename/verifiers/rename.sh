set -e
grep -q 'def rect_area' shapes.py
! grep -qw area shapes.py report.py
test "$(python3 report.py)" = 12
