// SPDX-License-Identifier: GPL-2.0
/*
 * rxlanectl: manage rxlane rules over generic netlink (no libnl).
 *
 *   rxlanectl add CIDR [proto N] [ports LO[-HI]] [vni N]   prints the rule ID
 *   rxlanectl del ID | flush | list
 * Test options, before the command:
 *   --as-uid UID   drop to UID (and its group) first
 *   --userns       enter a new user + network namespace as its root first
 *   --userns-keepnet  enter a new user namespace as its root, staying in the
 *                  current network namespace (the initial one's sysctls)
 *   sysctl-write NAME VALUE   write /proc/sys/net/rxlane/NAME
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <sched.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "rxlane_uapi.h"

#define BUFSZ 16384

struct msg {
	struct nlmsghdr n;
	struct genlmsghdr g;
	char buf[1024];
};

static void addattr(struct msg *m, int type, const void *data, int len)
{
	struct nlattr *a = (struct nlattr *)((char *)m + NLMSG_ALIGN(m->n.nlmsg_len));

	a->nla_type = type;
	a->nla_len = NLA_HDRLEN + len;
	memcpy((char *)a + NLA_HDRLEN, data, len);
	m->n.nlmsg_len = NLMSG_ALIGN(m->n.nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static void init_msg(struct msg *m, int family, int cmd, int flags)
{
	memset(m, 0, sizeof(*m));
	m->n.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	m->n.nlmsg_type = family;
	m->n.nlmsg_flags = NLM_F_REQUEST | flags;
	m->n.nlmsg_seq = 1;
	m->g.cmd = cmd;
	m->g.version = 1;
}

typedef void (*msg_cb)(struct nlattr **tb);

/* Send @m and read replies until ACK/DONE; returns 0 or -errno. */
static int talk(int fd, struct msg *m, msg_cb cb, int maxattr)
{
	char buf[BUFSZ];

	if (send(fd, m, m->n.nlmsg_len, 0) < 0)
		return -errno;
	for (;;) {
		int len = recv(fd, buf, sizeof(buf), 0);
		struct nlmsghdr *h;

		if (len < 0)
			return -errno;
		for (h = (struct nlmsghdr *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			if (h->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(h);
				return e->error;
			}
			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (cb) {
				struct nlattr *tb[64] = { 0 };
				struct genlmsghdr *g = NLMSG_DATA(h);
				struct nlattr *a = (struct nlattr *)((char *)g + GENL_HDRLEN);
				int rem = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);

				while (rem >= (int)NLA_HDRLEN && a->nla_len >= NLA_HDRLEN && a->nla_len <= rem) {
					if ((a->nla_type & NLA_TYPE_MASK) <= maxattr)
						tb[a->nla_type & NLA_TYPE_MASK] = a;
					rem -= NLA_ALIGN(a->nla_len);
					a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len));
				}
				cb(tb);
			}
			if (!(h->nlmsg_flags & NLM_F_MULTI) && !(m->n.nlmsg_flags & NLM_F_ACK))
				return 0;
		}
	}
}

static int family_id;
static void family_cb(struct nlattr **tb)
{
	if (tb[CTRL_ATTR_FAMILY_ID])
		family_id = *(uint16_t *)((char *)tb[CTRL_ATTR_FAMILY_ID] + NLA_HDRLEN);
}

#define ATTR(tb, t, type) (*(type *)((char *)(tb)[t] + NLA_HDRLEN))

static void rule_cb(struct nlattr **tb)
{
	char addr[INET6_ADDRSTRLEN] = "?";
	int fam;

	if (!tb[RXLANE_A_ID])
		return;
	fam = ATTR(tb, RXLANE_A_FAMILY, uint8_t);
	inet_ntop(fam, (char *)tb[RXLANE_A_ADDR] + NLA_HDRLEN, addr, sizeof(addr));
	printf("id=%u addr=%s/%u proto=%u ports=%u-%u vni=",
	       ATTR(tb, RXLANE_A_ID, uint32_t), addr,
	       ATTR(tb, RXLANE_A_PREFIXLEN, uint8_t), ATTR(tb, RXLANE_A_PROTO, uint8_t),
	       ATTR(tb, RXLANE_A_PORT_MIN, uint16_t), ATTR(tb, RXLANE_A_PORT_MAX, uint16_t));
	if (ATTR(tb, RXLANE_A_VNI, uint32_t) == RXLANE_VNI_ANY)
		printf("any");
	else
		printf("%u", ATTR(tb, RXLANE_A_VNI, uint32_t));
	printf(" hits=%llu\n", (unsigned long long)ATTR(tb, RXLANE_A_HITS, uint64_t));
}

static int usage(void)
{
	fprintf(stderr, "usage: rxlanectl [--as-uid UID] [--userns | --userns-keepnet] add CIDR [proto N] [ports LO[-HI]] [vni N] | del ID | flush | list | sysctl-write NAME VALUE\n");
	return 2;
}

static void enter_userns(int flags)
{
	uid_t uid = getuid();
	gid_t gid = getgid();
	char map[64];
	int fd;

	if (unshare(flags) < 0) {
		perror("rxlanectl: unshare");
		exit(3);
	}
	fd = open("/proc/self/setgroups", O_WRONLY);
	if (fd >= 0) { (void)!write(fd, "deny", 4); close(fd); }
	snprintf(map, sizeof(map), "0 %u 1", uid);
	fd = open("/proc/self/uid_map", O_WRONLY);
	if (fd < 0 || write(fd, map, strlen(map)) < 0) { perror("rxlanectl: uid_map"); exit(3); }
	close(fd);
	snprintf(map, sizeof(map), "0 %u 1", gid);
	fd = open("/proc/self/gid_map", O_WRONLY);
	if (fd < 0 || write(fd, map, strlen(map)) < 0) { perror("rxlanectl: gid_map"); exit(3); }
	close(fd);
}

int main(int argc, char **argv)
{
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	struct msg m;
	int fd, err, i = 1;
	const char *fam = RXLANE_GENL_NAME;

	while (i < argc && argv[i][0] == '-') {
		if (!strcmp(argv[i], "--as-uid") && i + 1 < argc) {
			int uid = atoi(argv[i + 1]);

			if (setgid(uid) || setuid(uid)) { perror("rxlanectl: setuid"); return 3; }
			/* stay dumpable so /proc/self/uid_map is ours (--userns) */
			prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
			i += 2;
		} else if (!strcmp(argv[i], "--userns")) {
			enter_userns(CLONE_NEWUSER | CLONE_NEWNET);
			i++;
		} else if (!strcmp(argv[i], "--userns-keepnet")) {
			enter_userns(CLONE_NEWUSER);
			i++;
		} else {
			return usage();
		}
	}
	if (i >= argc)
		return usage();

	if (!strcmp(argv[i], "sysctl-write")) {
		char path[256];

		if (i + 2 >= argc)
			return usage();
		snprintf(path, sizeof(path), "/proc/sys/net/rxlane/%s", argv[i + 1]);
		fd = open(path, O_WRONLY);
		if (fd < 0 || write(fd, argv[i + 2], strlen(argv[i + 2])) < 0) {
			fprintf(stderr, "rxlanectl: %s: %s\n", path, strerror(errno));
			return 1;
		}
		return 0;
	}

	fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_GENERIC);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("rxlanectl: netlink");
		return 1;
	}
	init_msg(&m, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, NLM_F_ACK);
	addattr(&m, CTRL_ATTR_FAMILY_NAME, fam, strlen(fam) + 1);
	err = talk(fd, &m, family_cb, CTRL_ATTR_MAX);
	if (err || !family_id) {
		fprintf(stderr, "rxlanectl: generic netlink family %s: %s\n", fam,
			err ? strerror(-err) : "not found");
		return 1;
	}

	if (!strcmp(argv[i], "add")) {
		char *cidr, *slash;
		uint8_t family, plen, proto = 0;
		unsigned char addr[16];
		uint16_t lo = 0, hi = 0xffff;
		uint32_t vni = RXLANE_VNI_ANY;
		int alen;

		if (++i >= argc)
			return usage();
		cidr = strdup(argv[i++]);
		slash = strchr(cidr, '/');
		if (slash)
			*slash++ = 0;
		if (inet_pton(AF_INET, cidr, addr) == 1) {
			family = AF_INET; alen = 4;
		} else if (inet_pton(AF_INET6, cidr, addr) == 1) {
			family = AF_INET6; alen = 16;
		} else {
			fprintf(stderr, "rxlanectl: bad address %s\n", cidr);
			return 2;
		}
		plen = slash ? atoi(slash) : alen * 8;
		for (; i + 1 < argc; i += 2) {
			if (!strcmp(argv[i], "proto"))
				proto = atoi(argv[i + 1]);
			else if (!strcmp(argv[i], "vni"))
				vni = strtoul(argv[i + 1], NULL, 0);
			else if (!strcmp(argv[i], "ports")) {
				char *dash = strchr(argv[i + 1], '-');
				lo = atoi(argv[i + 1]);
				hi = dash ? atoi(dash + 1) : lo;
			} else
				return usage();
		}
		if (i != argc)
			return usage();
		init_msg(&m, family_id, RXLANE_CMD_RULE_ADD, NLM_F_ACK);
		addattr(&m, RXLANE_A_FAMILY, &family, 1);
		addattr(&m, RXLANE_A_ADDR, addr, alen);
		addattr(&m, RXLANE_A_PREFIXLEN, &plen, 1);
		addattr(&m, RXLANE_A_PROTO, &proto, 1);
		addattr(&m, RXLANE_A_PORT_MIN, &lo, 2);
		addattr(&m, RXLANE_A_PORT_MAX, &hi, 2);
		addattr(&m, RXLANE_A_VNI, &vni, 4);
		err = talk(fd, &m, rule_cb, RXLANE_A_MAX);
	} else if (!strcmp(argv[i], "del") && i + 1 < argc) {
		uint32_t id = atoi(argv[i + 1]);

		init_msg(&m, family_id, RXLANE_CMD_RULE_DEL, NLM_F_ACK);
		addattr(&m, RXLANE_A_ID, &id, 4);
		err = talk(fd, &m, NULL, 0);
	} else if (!strcmp(argv[i], "flush")) {
		init_msg(&m, family_id, RXLANE_CMD_RULE_FLUSH, NLM_F_ACK);
		err = talk(fd, &m, NULL, 0);
	} else if (!strcmp(argv[i], "list")) {
		init_msg(&m, family_id, RXLANE_CMD_RULE_GET, NLM_F_DUMP);
		err = talk(fd, &m, rule_cb, RXLANE_A_MAX);
	} else {
		return usage();
	}
	if (err) {
		fprintf(stderr, "rxlanectl: %s\n", strerror(-err));
		return 1;
	}
	return 0;
}
