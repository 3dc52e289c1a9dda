set -e
for x in a b c; do
  test "$(cat out/$x.txt)" = "$x"
done
