chmod 000 cluster.json
if [ -r cluster.json ]; then
	echo "chmod 000 does not stop this user (root?) from reading; cannot test"
	exit 77
fi
