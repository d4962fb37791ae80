// SPDX-License-Identifier: GPL-2.0
/*
 * rxlane_probe: traffic for the rxlane selftest.
 *
 *   rxlane_probe recv PORT COUNT TIMEOUT_MS [READY_FIFO]
 *	bind UDP PORT, signal READY_FIFO, receive COUNT datagrams (or until
 *	TIMEOUT_MS of silence); print "received=N high_index=I inorder=0|1
 *	t_high_ns=T t_last_ns=T" (high_index: position of the first payload
 *	starting with 'H', -1 if none; inorder: sequence numbers of 'L'
 *	payloads only increase; times: CLOCK_MONOTONIC at receipt)
 *   rxlane_probe send DST_IP PORT COUNT [SPORT]
 *	send COUNT numbered datagrams "L<n>" through the normal stack, from
 *	source port SPORT if given (the same flow, so the same stage hashes,
 *	in every run), else from an ephemeral port
 *   rxlane_probe inject IFNAME NLOW LOW_IP HIGH_IP PORT [vxlan OUTER_SRC OUTER_DST VNI INNER_DMAC]
 *	queue NLOW low-priority frames to LOW_IP then one to HIGH_IP as if
 *	IFNAME received them in one burst (debugfs rxlane/inject, CONFIG_NET_RXLANE_SELFTEST);
 *	with vxlan, the frames are VXLAN-encapsulated (UDP 4789, VNI).
 *	LOW_IP/HIGH_IP may be IPv6 addresses (then no vxlan).
 *	Prints t_inject_ns (CLOCK_MONOTONIC just before queueing).
 *   rxlane_probe xmit IFNAME PEER_MAC NLOW LOW_IP HIGH_IP PORT
 *	the same frames (IPv4), addressed to PEER_MAC and transmitted on
 *	IFNAME in one burst (debugfs rxlane/xmit): on a veth whose peer is
 *	in NAPI mode, all of them wait in the peer's ring before it polls.
 *   rxlane_probe feature IFNAME gro|tso on|off
 *	switch an offload (legacy ethtool ioctl; the guest has no ethtool)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int do_recv(int argc, char **argv)
{
	long long t_high = 0, t_last = 0;
	int port, count, timeout, fd, n = 0, high = -1, inorder = 1, off = 0;
	long last = -1;
	struct sockaddr_in6 sa = { .sin6_family = AF_INET6 };
	int rcvbuf = 8 << 20;

	if (argc < 5)
		return 2;
	port = atoi(argv[2]);
	count = atoi(argv[3]);
	timeout = atoi(argv[4]);
	/* dual stack: IPv4 arrives v4-mapped */
	fd = socket(AF_INET6, SOCK_DGRAM, 0);
	sa.sin6_port = htons(port);
	setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("rxlane_probe: bind");
		return 1;
	}
	if (argc > 5) {
		int ffd = open(argv[5], O_WRONLY);

		if (ffd < 0 || write(ffd, "ready\n", 6) != 6) {
			perror("rxlane_probe: ready fifo");
			return 1;
		}
		close(ffd);
	}
	while (n < count) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char buf[2048];
		int len;

		if (poll(&p, 1, timeout) <= 0)
			break;
		len = recv(fd, buf, sizeof(buf) - 1, 0);
		if (len <= 0)
			break;
		buf[len] = 0;
		t_last = now_ns();
		if (buf[0] == 'H' && high < 0) {
			high = n;
			t_high = t_last;
		}
		if (buf[0] == 'L') {
			long seq = strtol(buf + 1, NULL, 10);

			if (seq <= last)
				inorder = 0;
			last = seq;
		}
		n++;
	}
	printf("received=%d high_index=%d inorder=%d t_high_ns=%lld t_last_ns=%lld\n",
	       n, high, inorder, t_high, t_last);
	return 0;
}

static int do_send(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	int fd, i, count;

	if (argc < 5)
		return 2;
	inet_pton(AF_INET, argv[2], &sa.sin_addr);
	sa.sin_port = htons(atoi(argv[3]));
	count = atoi(argv[4]);
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (argc > 5) {
		struct sockaddr_in src = { .sin_family = AF_INET,
					   .sin_port = htons(atoi(argv[5])) };
		int one = 1;

		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0) {
			perror("rxlane_probe: bind source port");
			return 1;
		}
	}
	for (i = 0; i < count; i++) {
		char buf[32];
		int len = snprintf(buf, sizeof(buf), "L%d", i);

		if (sendto(fd, buf, len, 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			perror("rxlane_probe: sendto");
			return 1;
		}
	}
	return 0;
}

static uint16_t csum(const void *data, int len)
{
	const uint8_t *p = data;
	uint32_t s = 0;

	for (; len > 1; len -= 2, p += 2)
		s += (p[0] << 8) | p[1];
	if (len)
		s += p[0] << 8;
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return htons(~s);
}

/* eth + ipv4 + udp(payload); returns length */
static int build_udp(uint8_t *f, const uint8_t *dmac, const uint8_t *smac,
		     uint32_t src, uint32_t dst, int sport, int dport,
		     const void *payload, int plen)
{
	uint8_t *ip = f + 14, *udp = ip + 20;
	int iplen = 20 + 8 + plen;

	memcpy(f, dmac, 6);
	memcpy(f + 6, smac, 6);
	f[12] = 0x08; f[13] = 0x00;
	memset(ip, 0, 20);
	ip[0] = 0x45;
	ip[2] = iplen >> 8; ip[3] = iplen & 0xff;
	ip[6] = 0x40;	/* DF */
	ip[8] = 64;
	ip[9] = 17;
	memcpy(ip + 12, &src, 4);
	memcpy(ip + 16, &dst, 4);
	*(uint16_t *)(ip + 10) = csum(ip, 20);
	udp[0] = sport >> 8; udp[1] = sport & 0xff;
	udp[2] = dport >> 8; udp[3] = dport & 0xff;
	udp[4] = (8 + plen) >> 8; udp[5] = (8 + plen) & 0xff;
	udp[6] = udp[7] = 0;	/* no checksum */
	memcpy(udp + 8, payload, plen);
	return 14 + iplen;
}

/* eth + ipv6 + udp(payload), UDP checksum computed (mandatory in IPv6) */
static int build_udp6(uint8_t *f, const uint8_t *dmac, const uint8_t *smac,
		      const struct in6_addr *src, const struct in6_addr *dst,
		      int sport, int dport, const void *payload, int plen)
{
	uint8_t *ip = f + 14, *udp = ip + 40, pseudo[40 + 8 + 256];
	int ulen = 8 + plen;

	memcpy(f, dmac, 6);
	memcpy(f + 6, smac, 6);
	f[12] = 0x86; f[13] = 0xdd;
	memset(ip, 0, 40);
	ip[0] = 0x60;
	ip[4] = ulen >> 8; ip[5] = ulen & 0xff;
	ip[6] = 17;
	ip[7] = 64;
	memcpy(ip + 8, src, 16);
	memcpy(ip + 24, dst, 16);
	udp[0] = sport >> 8; udp[1] = sport & 0xff;
	udp[2] = dport >> 8; udp[3] = dport & 0xff;
	udp[4] = ulen >> 8; udp[5] = ulen & 0xff;
	udp[6] = udp[7] = 0;
	memcpy(udp + 8, payload, plen);
	/* pseudo header: src, dst, length, next header */
	memcpy(pseudo, src, 16);
	memcpy(pseudo + 16, dst, 16);
	pseudo[32] = pseudo[33] = 0; pseudo[34] = ulen >> 8; pseudo[35] = ulen & 0xff;
	pseudo[36] = pseudo[37] = pseudo[38] = 0; pseudo[39] = 17;
	memcpy(pseudo + 40, udp, ulen);
	*(uint16_t *)(udp + 6) = csum(pseudo, 40 + ulen);
	if (!*(uint16_t *)(udp + 6))
		*(uint16_t *)(udp + 6) = 0xffff;
	return 14 + 40 + ulen;
}

static int parse_mac(const char *s, uint8_t *mac)
{
	return sscanf(s, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &mac[0], &mac[1],
		      &mac[2], &mac[3], &mac[4], &mac[5]) == 6 ? 0 : -1;
}

static int dev_mac(const char *ifname, uint8_t *mac)
{
	struct ifreq ifr = { 0 };
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
	if (ioctl(fd, SIOCGIFHWADDR, &ifr) < 0)
		return -1;
	memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
	close(fd);
	return 0;
}

static int xmit_mode;
static uint8_t xmit_dmac[6];

static int do_inject(int argc, char **argv)
{
	uint8_t dmac[6], smac[6] = { 0x02, 0, 0, 0, 0, 0x99 }, imac[6];
	uint32_t low, high, osrc = 0, odst = 0, ifindex, count;
	struct in6_addr low6, high6, src6;
	int nlow, port, vxlan = 0, vni = 0, i, fd, v6 = 0;
	size_t cap, off = 8;
	uint8_t *buf;

	if (argc < 7)
		return 2;
	ifindex = if_nametoindex(argv[2]);
	if (!ifindex || dev_mac(argv[2], dmac)) {
		fprintf(stderr, "rxlane_probe: no device %s\n", argv[2]);
		return 1;
	}
	if (xmit_mode) {
		/* from the device itself to its peer */
		memcpy(smac, dmac, 6);
		memcpy(dmac, xmit_dmac, 6);
	}
	nlow = atoi(argv[3]);
	if (strchr(argv[4], ':')) {
		v6 = 1;
		inet_pton(AF_INET6, argv[4], &low6);
		inet_pton(AF_INET6, argv[5], &high6);
		inet_pton(AF_INET6, "fd00:254::1", &src6);
	} else {
		inet_pton(AF_INET, argv[4], &low);
		inet_pton(AF_INET, argv[5], &high);
	}
	port = atoi(argv[6]);
	if (argc > 7) {
		if (argc < 12 || strcmp(argv[7], "vxlan"))
			return 2;
		vxlan = 1;
		inet_pton(AF_INET, argv[8], &osrc);
		inet_pton(AF_INET, argv[9], &odst);
		vni = atoi(argv[10]);
		if (parse_mac(argv[11], imac))
			return 2;
	}
	count = nlow + 1;
	cap = 8 + count * 256;
	buf = calloc(1, cap);
	memcpy(buf, &ifindex, 4);
	memcpy(buf + 4, &count, 4);
	for (i = 0; i <= nlow; i++) {
		uint8_t frame[256], inner[200];
		char payload[32];
		int plen, flen;
		uint32_t dst = i < nlow ? low : high;
		uint16_t l16;

		plen = i < nlow ? snprintf(payload, sizeof(payload), "L%d", i)
				: snprintf(payload, sizeof(payload), "H");
		if (v6) {
			flen = build_udp6(frame, dmac, smac, &src6,
					  i < nlow ? &low6 : &high6, 40000, port,
					  payload, plen);
		} else if (!vxlan) {
			flen = build_udp(frame, dmac, smac, htonl(0xc0a8fe01), dst,
					 40000, port, payload, plen);
		} else {
			uint8_t vx[8 + 200];
			int ilen = build_udp(inner, imac, smac, htonl(0xc0a8fe01),
					     dst, 40000, port, payload, plen);

			memset(vx, 0, 8);
			vx[0] = 0x08;
			vx[4] = vni >> 16; vx[5] = vni >> 8; vx[6] = vni;
			memcpy(vx + 8, inner, ilen);
			/* fixed outer source port: one outer flow */
			flen = build_udp(frame, dmac, smac, osrc, odst, 50000, 4789,
					 vx, 8 + ilen);
		}
		l16 = flen;
		memcpy(buf + off, &l16, 2);
		memcpy(buf + off + 2, frame, flen);
		off += 2 + flen;
	}
	/* debugfs is also mounted at /debug by the guest's init: `ip netns
	 * exec` remounts /sys and hides /sys/kernel/debug
	 */
	fd = open(xmit_mode ? "/debug/rxlane/xmit" : "/debug/rxlane/inject", O_WRONLY);
	if (fd < 0)
		fd = open(xmit_mode ? "/sys/kernel/debug/rxlane/xmit" :
			  "/sys/kernel/debug/rxlane/inject", O_WRONLY);
	printf("t_inject_ns=%lld\n", now_ns());
	fflush(stdout);
	if (fd < 0 || write(fd, buf, off) != (ssize_t)off) {
		fprintf(stderr, "rxlane_probe: inject: %s\n", strerror(errno));
		return 1;
	}
	close(fd);
	return 0;
}

static int do_feature(int argc, char **argv)
{
	struct ethtool_value ev = { 0 };
	struct ifreq ifr = { 0 };
	int fd;

	if (argc < 5)
		return 2;
	if (!strcmp(argv[3], "gro"))
		ev.cmd = ETHTOOL_SGRO;
	else if (!strcmp(argv[3], "tso"))
		ev.cmd = ETHTOOL_STSO;
	else
		return 2;
	ev.data = !strcmp(argv[4], "on");
	strncpy(ifr.ifr_name, argv[2], IFNAMSIZ - 1);
	ifr.ifr_data = (void *)&ev;
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (ioctl(fd, SIOCETHTOOL, &ifr) < 0) {
		fprintf(stderr, "rxlane_probe: %s %s %s: %s\n", argv[2], argv[3],
			argv[4], strerror(errno));
		return 1;
	}
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	int ret = 2;

	if (argc > 1 && !strcmp(argv[1], "recv"))
		ret = do_recv(argc, argv);
	else if (argc > 1 && !strcmp(argv[1], "send"))
		ret = do_send(argc, argv);
	else if (argc > 1 && !strcmp(argv[1], "inject"))
		ret = do_inject(argc, argv);
	else if (argc > 3 && !strcmp(argv[1], "xmit")) {
		xmit_mode = 1;
		if (parse_mac(argv[3], xmit_dmac))
			return 2;
		/* drop PEER_MAC: the rest is inject's argument list */
		memmove(&argv[3], &argv[4], (argc - 3) * sizeof(*argv));
		ret = do_inject(argc - 1, argv);
	} else if (argc > 1 && !strcmp(argv[1], "feature"))
		ret = do_feature(argc, argv);
	if (ret == 2)
		fprintf(stderr, "usage: see the comment at the top of rxlane_probe.c\n");
	return ret;
}
